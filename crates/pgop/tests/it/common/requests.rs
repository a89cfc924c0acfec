//! The counter of API requests: a client (`counting_client`) that records the method, path
//! and query of every request it sends into `Requests`, for tests that check how much the
//! operator reads.

use kube::Client;
use std::sync::Arc;

/// Every request a [`counting_client`] sent: method, path and query.
#[derive(Clone, Default)]
pub struct Requests(Arc<std::sync::Mutex<Vec<String>>>);

impl Requests {
    /// How many so far (a mark for [`Self::since`]).
    pub fn len(&self) -> usize {
        self.0.lock().map(|v| v.len()).unwrap_or_default()
    }

    /// The requests sent after the first `mark`.
    pub fn since(&self, mark: usize) -> Vec<String> {
        self.0
            .lock()
            .map(|v| v.iter().skip(mark).cloned().collect())
            .unwrap_or_default()
    }

    /// The reads (GET: a get or a list) after the first `mark`, watches left out.
    pub fn reads_since(&self, mark: usize) -> Vec<String> {
        self.since(mark)
            .into_iter()
            .filter(|r| r.starts_with("GET ") && !is_watch(r))
            .collect()
    }
}

/// Whether a recorded request is a watch (`?watch=true`).
pub fn is_watch(request: &str) -> bool {
    request.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
    })
}

/// A client of `config` that records the method, path and query of every request it sends.
pub fn counting_client(config: &kube::Config, requests: &Requests) -> kube::Result<Client> {
    let log = requests.0.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if let Ok(mut v) = log.lock() {
            let uri = req.uri();
            let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
            v.push(format!("{} {}{query}", req.method(), uri.path()));
        }
        req
    });
    Ok(kube::client::ClientBuilder::try_from(config.clone())?
        .with_layer(&layer)
        .build())
}
