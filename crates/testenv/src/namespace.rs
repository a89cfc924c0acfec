//! A namespace per test, so tests can share one control plane without seeing each other.

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use std::hash::{BuildHasher, Hasher};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to create namespace {name}")]
    Create {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to delete namespace {name}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// A namespace with a random suffix. Call [`TestNamespace::delete`] at the end of a test;
/// if the test panics first, dropping it deletes the namespace in the background.
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    config: kube::Config,
    deleted: bool,
}

fn random_suffix() -> String {
    // RandomState is seeded from the OS per instance: good enough for unique names.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:08x}", h.finish() as u32)
}

impl TestNamespace {
    /// Creates `<prefix>-<8 hex digits>` (the prefix is cut to keep within 63 characters).
    pub async fn create(config: &kube::Config, prefix: &str) -> Result<Self, Error> {
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(50)
            .collect();
        let name = format!("{}-{}", prefix.trim_matches('-'), random_suffix());
        let client = Client::try_from(config.clone()).map_err(|source| Error::Create {
            name: name.clone(),
            source,
        })?;
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        ns.metadata.labels = Some(
            [(
                "pgop.testenv/test-namespace".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        Api::<Namespace>::all(client)
            .create(&PostParams::default(), &ns)
            .await
            .map_err(|source| Error::Create {
                name: name.clone(),
                source,
            })?;
        Ok(Self {
            name,
            config: config.clone(),
            deleted: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace (its contents go with it once kube-controller-manager's
    /// namespace controller runs; without it the namespace stays Terminating).
    pub async fn delete(mut self) -> Result<(), Error> {
        self.deleted = true;
        delete(&self.config, &self.name).await
    }
}

async fn delete(config: &kube::Config, name: &str) -> Result<(), Error> {
    let client = Client::try_from(config.clone()).map_err(|source| Error::Delete {
        name: name.to_string(),
        source,
    })?;
    match Api::<Namespace>::all(client)
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            name: name.to_string(),
            source,
        }),
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        // Runs on its own thread and runtime: the test's runtime may be single-threaded
        // and blocked right here.
        let config = self.config.clone();
        let name = self.name.clone();
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                let _ = rt.block_on(delete(&config, &name));
            }
        })
        .join();
        if joined.is_err() {
            eprintln!("testenv: failed to delete namespace {}", self.name);
        }
    }
}
