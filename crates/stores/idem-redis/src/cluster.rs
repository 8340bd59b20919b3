//! Redis Cluster: hash slots, the masters and the slots they serve, and
//! scanning every master.

use idem_core::StoreError;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Value};

use crate::conn::Conn;
use crate::reply::unavailable;
use crate::store::Inner;

impl Inner {
    /// The host of the first seed node: on a one-node cluster, where
    /// `CLUSTER NODES` leaves the node's own address empty, that is its
    /// address.
    pub(crate) fn seed_host(&self) -> &str {
        match self.client.as_ref().map(|c| c.get_connection_info().addr()) {
            Some(redis::ConnectionAddr::Tcp(host, _))
            | Some(redis::ConnectionAddr::TcpTls { host, .. }) => host,
            _ => "",
        }
    }

    /// The nodes that hold keys: the standalone Redis (`None`), or each
    /// cluster master. On a cluster where some slots have no master that
    /// is up (one marked `fail?` or `fail`, not yet failed over), an error
    /// that names those slots: whatever reads or removes every key would
    /// otherwise miss theirs and not know it.
    pub(crate) async fn masters(&self) -> Result<Vec<Option<Node>>, StoreError> {
        Ok(match &self.conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(c) => masters(&cluster_nodes(c).await?, self.seed_host())?
                .into_iter()
                .map(Some)
                .collect(),
        })
    }

    /// `cmd` on `node`, one of [`masters`](Inner::masters).
    pub(crate) async fn query_node(
        &self,
        node: &Option<Node>,
        cmd: Cmd,
    ) -> Result<Value, StoreError> {
        match (node, &self.conn) {
            (Some((host, port)), Conn::Cluster(c)) => {
                c.clone()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        }),
                    )
                    .await
            }
            _ => cmd.query_async(&mut self.conn()).await,
        }
        .map_err(unavailable)
    }

    /// Every key matching `pattern`: one SCAN, or one per cluster master.
    /// A key may come back more than once (SCAN's own guarantee).
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut keys = Vec::new();
        for node in self.masters().await? {
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply = self.query_node(&node, cmd).await?;
                let (next, batch): (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(keys)
    }
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, the text
/// between the first `{` and the next `}` when not empty, else of the key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16384
}

/// `CLUSTER NODES`, asked of any node.
pub(crate) async fn cluster_nodes(c: &ClusterConnection) -> Result<String, StoreError> {
    let reply = c
        .clone()
        .route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(unavailable)?;
    redis::from_redis_value(reply).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The masters' addresses in `CLUSTER NODES` output, when together they
/// serve every slot; otherwise an error naming the slots without a master
/// that is up, and the masters marked failing.
pub(crate) fn masters(nodes: &str, seed_host: &str) -> Result<Vec<Node>, StoreError> {
    let all = cluster_masters(nodes, seed_host);
    let mut served = vec![false; SLOTS];
    for m in all.iter().filter(|m| m.up) {
        for r in &m.slots {
            for slot in r.clone() {
                if let Some(s) = served.get_mut(usize::from(slot)) {
                    *s = true;
                }
            }
        }
    }
    let uncovered = ranges(&served);
    if uncovered.is_empty() {
        return Ok(all.into_iter().filter(|m| m.up).map(|m| m.node).collect());
    }
    let failing: Vec<String> = all
        .iter()
        .filter(|m| !m.up)
        .map(|m| format!("{}:{} is marked {}", m.node.0, m.node.1, m.flags))
        .collect();
    let why = if failing.is_empty() {
        "no node serves them".to_owned()
    } else {
        failing.join(", ")
    };
    Err(StoreError::unavailable(format!(
        "the Redis Cluster's slots {} have no master that is up ({why}): their keys cannot be \
         read or removed, so nothing was; run again once a replica has taken over or the master \
         is back (CLUSTER NODES shows each node's state)",
        uncovered.join(", ")
    )))
}

/// Redis Cluster's hash slots.
const SLOTS: usize = 16384;

/// The runs of slots `served` marks false, as `a-b` (or `a`).
fn ranges(served: &[bool]) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = None;
    for (slot, &s) in served.iter().chain([&true]).enumerate() {
        match (s, start) {
            (false, None) => start = Some(slot),
            (true, Some(a)) => {
                out.push(if a + 1 == slot {
                    a.to_string()
                } else {
                    format!("{a}-{}", slot - 1)
                });
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The address of the master serving `slot`, from `CLUSTER NODES` output.
pub(crate) fn master_of(nodes: &str, slot: u16, seed_host: &str) -> Option<Node> {
    cluster_masters(nodes, seed_host)
        .into_iter()
        .filter(|m| m.up)
        .find(|m| m.slots.iter().any(|r| r.contains(&slot)))
        .map(|m| m.node)
}

/// A node's host and port.
pub(crate) type Node = (String, u16);

/// A master in `CLUSTER NODES` output.
struct Master {
    node: Node,
    /// The slot ranges it serves (slots being moved, `[…]`, left out).
    slots: Vec<std::ops::RangeInclusive<u16>>,
    /// Not marked `fail?` or `fail`.
    up: bool,
    flags: String,
}

/// The masters in `CLUSTER NODES` output. A node that has not learnt its
/// own address (a cluster of one) is at `seed_host`.
fn cluster_masters(nodes: &str, seed_host: &str) -> Vec<Master> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let host = if host.is_empty() { seed_host } else { host };
            let slots = fields
                .iter()
                .skip(8)
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some(a.parse().ok()?..=b.parse().ok()?)
                })
                .collect();
            Some(Master {
                node: (host.to_owned(), port.parse().ok()?),
                slots,
                up: !flags.split(',').any(|f| f == "fail" || f == "fail?"),
                flags: (*flags).to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{master_of, masters, slot};

    #[test]
    fn slots_follow_the_hash_tag() {
        // Known values from the Redis Cluster specification.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn the_master_of_a_slot_comes_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922 [10923->-c3]
c3 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected
e5 127.0.0.1:7004@17004 master,fail - 0 0 5 disconnected 12000
";
        let at = |port| Some(("127.0.0.1".to_owned(), port));
        assert_eq!(master_of(nodes, 0, "seed"), at(7000));
        assert_eq!(master_of(nodes, 5461, "seed"), at(7001));
        assert_eq!(master_of(nodes, 10923, "seed"), at(7002));
        assert_eq!(master_of(nodes, 12000, "seed"), at(7002));
        assert_eq!(masters(nodes, "seed").unwrap().len(), 3);
        // A cluster of one does not know its own address.
        let alone = "a1 :7000@17000 myself,master - 0 0 0 connected 0-16383\n";
        assert_eq!(
            master_of(alone, 9000, "10.0.0.5"),
            Some(("10.0.0.5".to_owned(), 7000))
        );
    }

    /// Slots whose master is failing, or that no node serves, are named,
    /// and no master is listed: a scan of the others would miss their keys.
    #[test]
    fn slots_without_a_master_that_is_up_are_named() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master,fail? - 0 0 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16382
";
        let e = masters(nodes, "seed").unwrap_err().to_string();
        assert!(e.contains("slots 5461-10922, 16383 have"), "{e}");
        assert!(e.contains("127.0.0.1:7001 is marked master,fail?"), "{e}");
        assert_eq!(master_of(nodes, 6000, "seed"), None);
        let healed = nodes
            .replace("master,fail?", "master")
            .replace("16382", "16383");
        assert_eq!(masters(&healed, "seed").unwrap().len(), 3);
    }
}
