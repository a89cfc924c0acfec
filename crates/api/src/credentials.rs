//! `spec.credentials`: where the passwords of the application owner and of the superuser
//! come from, and whether the superuser may log in over the network at all.
//!
//! pgop keeps the Secrets the instances read, `<cluster>-app` and (with
//! `superuserAccess`) `<cluster>-superuser`. A Secret the user names here is only read:
//! the operator copies its password into pgop's own Secret, whose derived keys (the URI,
//! the authority) follow, and the instance managers set it on the role.
//!
//! Every schema rule here has a twin in [`crate::validation`], like the rest of the spec.

use crate::formats;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who logs in with which password.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSpec {
    /// A Secret of the cluster's namespace holding the application owner's password
    /// (`kubernetes.io/basic-auth` shape: `password`, and optionally `username`, which must
    /// then be `spec.bootstrap.initdb.owner`). Unset: pgop generates the password once.
    /// pgop never writes this Secret: it copies the password into `<cluster>-app` at every
    /// reconcile, so changing it here changes the role's password. A Secret that is missing
    /// or unusable is refused with a `CredentialsSecretRefused` Event naming this field,
    /// and the password in force stays. It may not be one of the cluster's own Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub app_secret: Option<String>,

    /// Let the superuser `postgres` log in over the network, with a password and over TLS
    /// only (never without TLS, whatever `spec.tls.allowPlaintext` says). Off by default:
    /// the superuser then has no password and every network login as `postgres` is
    /// refused before `spec.postgresql.pgHba` is read. On: pgop keeps the Secret
    /// `<cluster>-superuser` (as `<cluster>-app`, for the `postgres` database); turning it
    /// off again removes the password and that Secret.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superuser_access: bool,

    /// With `superuserAccess`: a Secret holding the superuser's password (`password`, and
    /// optionally `username`, which must then be `postgres`), copied into
    /// `<cluster>-superuser` as `appSecret` is into `<cluster>-app`. Unset: pgop generates
    /// it. Not read while `superuserAccess` is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub superuser_secret: Option<String>,
}
