//! The spans a runner emits: one around each handler run and each broker
//! settle, and (through a traced store) one around each store call, each
//! with its namespace and outcome class, never a key's or outcome's bytes.

use std::sync::Arc;

use idem_consumer::{HandlerError, MemorySource, Message, Runner};
use idem_core::layer::{StoreExt as _, Trace};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

mod support;

/// A span's fields: name and value.
type FieldValues = Vec<(String, String)>;

/// Every span's id, name and fields, as recorded (at creation and later).
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(Id, String, FieldValues)>>>);

struct Fields<'a>(&'a mut FieldValues);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .push((id.clone(), attrs.metadata().name().to_owned(), fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock();
        if let Some((_, _, fields)) = spans.iter_mut().rev().find(|(i, _, _)| i == id) {
            values.record(&mut Fields(fields));
        }
    }
}

impl Spans {
    /// The fields of each span named `name`.
    fn named(&self, name: &str) -> Vec<FieldValues> {
        self.0
            .lock()
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, f)| f.clone())
            .collect()
    }
}

fn has(fields: &[(String, String)], name: &str, value: &str) -> bool {
    fields.iter().any(|(n, v)| n == name && v == value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_settle_and_store_calls_run_in_spans_with_their_outcome() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry()
        .with(spans.clone())
        .with(tracing_subscriber::filter::LevelFilter::DEBUG);
    // Global: the runner's tasks run on every worker thread. The only
    // test in this file, so the only one to set it.
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let source = MemorySource::new("orders");
    for id in ["ok-1", "bad-2", "ok-1"] {
        let mut m = Message::new("secret body");
        m.id = Some(id.to_owned());
        source.push(m);
    }
    let handler = |m: Message, _claim: ClaimHandle| async move {
        if m.id.as_deref() == Some("bad-2") {
            Err(HandlerError::permanent("refused"))
        } else {
            Ok::<_, HandlerError>(Bytes::from_static(b"secret outcome"))
        }
    };
    let store = MemoryStore::new().layer(Trace);
    let runner = Runner::new(Guard::new(store), source.clone(), handler).max_attempts(1);
    let probe = source.clone();
    support::run_until(runner, move || probe.unsettled() == 0).await;

    let handlers = spans.named("handler");
    assert_eq!(handlers.len(), 2, "ok-1 once, bad-2 once: {handlers:?}");
    assert!(handlers.iter().all(|f| has(f, "namespace", "orders")));
    assert!(handlers.iter().any(|f| has(f, "outcome", "ok")));
    assert!(handlers.iter().any(|f| has(f, "outcome", "error")));

    let settles = spans.named("settle");
    for action in ["ack", "ack_duplicate", "dead_letter"] {
        assert!(
            settles
                .iter()
                .any(|f| has(f, "action", action) && has(f, "result", "ok")),
            "{action}: {settles:?}"
        );
    }

    let store = spans.named("store");
    assert!(
        store
            .iter()
            .any(|f| has(f, "operation", "begin") && has(f, "outcome", "ok"))
    );
    assert!(
        store
            .iter()
            .any(|f| has(f, "operation", "release") && has(f, "outcome", "ok"))
    );
    let all = format!("{:?}", spans.0.lock());
    assert!(
        !all.contains("secret"),
        "no body or outcome in a span: {all}"
    );
}
