//! Opening the store the settings name: read once into a [`StoreSpec`]
//! (`spec`), then each kind opened as its own type (`single`), a tiered
//! store from the two tiers it names (`tiered`).

mod single;
mod spec;
mod tiered;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use idem_core::SharedStore;
use idem_core::admin::Admin;
use idem_core::layer::{Measured, Traced};
use idem_file::FileStore;

#[cfg(feature = "sql")]
pub use self::single::{sql, sql_failure};
#[cfg(feature = "sql")]
pub use self::spec::SqlSpec;
pub use self::spec::{HotTier, StoreSpec};
use crate::config::StoreSettings;
use crate::run::Failure;

/// An open store, and what must happen to it at shutdown.
pub struct OpenStore {
    pub store: SharedStore,
    pub file: Option<FileStore>,
    pub description: String,
    /// The operator's view of the store (`idem stats`, `idem purge`), where
    /// it has one.
    pub admin: Option<Arc<dyn Admin>>,
    /// What else must finish first (a tiered store's write-behind queue and
    /// key filter snapshot).
    pub shutdown: Option<BoxFuture<'static, ()>>,
}

impl OpenStore {
    /// An open SQL store, with its operator's view.
    #[cfg(feature = "sql")]
    pub fn sql(store: idem_sql::SqlStore) -> Self {
        Self {
            description: store.description().to_owned(),
            admin: Some(Arc::new(store.clone())),
            store: Arc::new(store),
            file: None,
            shutdown: None,
        }
    }

    /// Makes everything durable before the process exits.
    pub async fn close(self) {
        if let Some(shutdown) = self.shutdown {
            shutdown.await;
        }
        if let Some(file) = self.file
            && let Err(e) = file.flush()
        {
            tracing::error!(error = %e, "flushing the store at shutdown failed");
        }
    }
}

/// Opens the store `settings` name (see [`open_spec`]).
pub async fn open(settings: &StoreSettings) -> Result<OpenStore, Failure> {
    open_spec(&StoreSpec::parse(settings)?, settings).await
}

/// Opens `spec`, measured and traced: every call counted and timed
/// (`idem_store_calls_total`, `idem_store_call_seconds`, labelled with the
/// store's kind) and run in a debug-level `store` span; a tiered store's
/// tiers each so too, apart. A store that will not open (a directory in
/// use, Redis unreachable) is a failure to start, with what to check.
pub async fn open_spec(spec: &StoreSpec, settings: &StoreSettings) -> Result<OpenStore, Failure> {
    let mut open = match spec {
        StoreSpec::Memory => OpenStore {
            store: Arc::new(single::memory(settings)),
            admin: None,
            file: None,
            description: "memory store (records are lost when the process ends)".into(),
            shutdown: None,
        },
        StoreSpec::File { path } => {
            let store = single::file(path, settings)?;
            OpenStore {
                store: Arc::new(store.clone()),
                admin: Some(Arc::new(store.clone())),
                file: Some(store),
                description: single::file_description(path),
                shutdown: None,
            }
        }
        #[cfg(feature = "redis")]
        StoreSpec::Redis(redis) => {
            let (store, description) = single::redis(redis, settings).await?;
            OpenStore {
                admin: Some(Arc::new(store.clone())),
                store: Arc::new(store),
                file: None,
                description,
                shutdown: None,
            }
        }
        #[cfg(feature = "sql")]
        StoreSpec::Sql(sql) => OpenStore::sql(single::sql(sql, settings, |b| b).await?),
        StoreSpec::Tiered { hot, cold } => {
            let tiered = tiered::open(hot, cold, settings).await?;
            OpenStore {
                store: tiered.store,
                admin: None,
                file: None,
                description: tiered.description,
                shutdown: Some(tiered.shutdown),
            }
        }
    };
    open.store = Arc::new(Traced::new(Measured::new(open.store, spec.kind())));
    Ok(open)
}
