//! The errors of a pass: each step's, and the writes' (with those of reading the children,
//! [`ListError`], and of applying them, [`ApplyError`], which `observe::dereference` and
//! `write::apply` return). A failed pass is retried after the cluster's own backoff
//! ([`super::error_policy`]).

use super::{build, pki};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the cluster's children")]
    Dereference(#[from] ListError),
    #[error("failed to build the cluster's children")]
    Build(#[from] build::Error),
    #[error("failed to apply the cluster's children")]
    Apply(#[from] ApplyError),
    #[error("failed to patch the cluster's status")]
    PatchStatus(#[source] kube::Error),
    #[error("failed to remove the request annotation {0}")]
    ClearAnnotation(&'static str, #[source] kube::Error),
    #[error("failed to read a PersistentVolume")]
    ReadVolume(#[source] kube::Error),
    #[error("failed to list the cluster's PostgresBackups")]
    ListBackups(#[source] kube::Error),
    #[error("failed to create a scheduled PostgresBackup")]
    ScheduleBackup(#[source] kube::Error),
    #[error("failed to generate a password")]
    GeneratePassword(#[source] getrandom::Error),
    #[error("the cluster's certificates")]
    Certificates(#[from] pki::Error),
    #[error("the cluster has no namespace")]
    NoNamespace,
}

impl Error {
    /// The variant name: a metric label and an Event reason.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Dereference(_) => "Dereference",
            Error::Build(_) => "Build",
            Error::Apply(_) => "Apply",
            Error::PatchStatus(_) => "PatchStatus",
            Error::ClearAnnotation(..) => "ClearAnnotation",
            Error::ReadVolume(_) => "ReadVolume",
            Error::ListBackups(_) => "ListBackups",
            Error::ScheduleBackup(_) => "ScheduleBackup",
            Error::GeneratePassword(_) => "GeneratePassword",
            Error::Certificates(_) => "Certificates",
            Error::NoNamespace => "NoNamespace",
        }
    }
}

/// Reading the children (`observe::dereference`): one kind's LIST failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to list {kind}s of the cluster")]
pub struct ListError {
    pub kind: &'static str,
    #[source]
    pub source: kube::Error,
}

/// Writing the children (`write::apply`).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("failed to apply {kind} {name}")]
    Apply {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to delete {kind} {name}")]
    Delete {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to serialize {kind} {name}")]
    Serialize {
        kind: &'static str,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}
