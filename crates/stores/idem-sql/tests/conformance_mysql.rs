//! The SQL store passes the conformance kit on a real MySQL or MariaDB
//! (`IDEM_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`).
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use idem_sql::SqlStore;
use idem_testkit::Subject;

async fn subject() -> Option<Subject<SqlStore>> {
    let store = support::open("MySQL", &support::mysql_url(), |b| {
        b.table("idem_conformance")
    })
    .await?;
    Some(support::subject(store))
}

idem_testkit::conformance_tests!(subject());

/// The same on 16 tables, one statement per call.
mod sixteen_shards_one_statement_each {
    use super::*;

    async fn subject() -> Option<Subject<SqlStore>> {
        let store = support::open("MySQL", &support::mysql_url(), |b| {
            b.table("idem_conformance_sharded")
                .shards(16)
                .coalesce(false)
        })
        .await?;
        Some(support::subject(store))
    }

    idem_testkit::conformance_tests!(subject());

    /// The operator's cases across 16 tables.
    mod admin {
        use super::*;

        idem_testkit::admin_conformance_tests!(subject());
    }

    /// The tier cases across 16 tables: imports split by table, and
    /// completed keys merged from them.
    mod tier {
        use super::*;

        idem_testkit::tier_conformance_tests!(subject());
    }
}

/// The tier cases: imports, token floors and marks, and the completed keys.
mod tier {
    use super::*;

    idem_testkit::tier_conformance_tests!(subject());
}

/// The operator's cases: counting, listing and purging namespaces.
mod admin {
    use super::*;

    idem_testkit::admin_conformance_tests!(subject());
}
