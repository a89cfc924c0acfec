//! `spec.roles`: PostgreSQL roles declared in the cluster spec, which the primary's
//! instance manager makes PostgreSQL match (`CREATE ROLE`, `ALTER ROLE`, `GRANT`/`REVOKE`
//! of memberships, `DROP ROLE` for `ensure: absent`). Roles the spec does not name are left
//! alone, and a role removed from the spec is kept (retain): only `ensure: absent` drops.
//!
//! Every schema rule here has a twin in [`crate::validation`], like the rest of the spec.

use crate::cel;
use crate::formats;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most roles in `spec.roles`.
pub const MAX_ROLES: usize = 32;
/// Most roles in one role's `inRoles`.
pub const MAX_IN_ROLES: usize = 16;
/// The highest `connectionLimit` accepted (-1: no limit).
pub const MAX_CONNECTION_LIMIT: i32 = 100_000;
pub use crate::reserved::FORBIDDEN_MEMBERSHIPS;

/// One PostgreSQL role declared in the spec.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = cel::unreserved_name("name"))]
#[x_kube(validation = cel::not_member_of_itself())]
pub struct RoleSpec {
    /// The role's name: a lower-case identifier (`^[a-z_][a-z0-9_]{0,62}$`), not a name
    /// PostgreSQL or pgop keeps (`postgres`, `streaming_replica`, `pg_*`, ...), nor the
    /// application owner (`spec.bootstrap.initdb.owner`), whose password pgop keeps.
    #[schemars(length(min = 1, max = 63), pattern(formats::IDENTIFIER_PATTERN))]
    pub name: String,

    /// `present` (the default): the role exists with these attributes; `absent`: it is
    /// dropped (a role that still owns objects or holds privileges is reported, not
    /// forced).
    #[serde(default)]
    pub ensure: Ensure,

    /// `LOGIN`: the role may log in (default false: a group role).
    #[serde(default)]
    pub login: bool,

    /// `SUPERUSER`.
    #[serde(default)]
    pub superuser: bool,

    /// `CREATEDB`.
    #[serde(default)]
    pub createdb: bool,

    /// `CREATEROLE`.
    #[serde(default)]
    pub createrole: bool,

    /// `INHERIT` (default true): the role uses the privileges of the roles it is a member of.
    #[serde(default = "default_true")]
    pub inherit: bool,

    /// `CONNECTION LIMIT`: -1 (the default) for no limit, else 0 to 100000.
    #[serde(default = "default_connection_limit")]
    #[schemars(range(min = -1, max = MAX_CONNECTION_LIMIT))]
    pub connection_limit: i32,

    /// `VALID UNTIL`: when the role's password stops working (RFC 3339 with a time zone);
    /// unset: forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::TIMESTAMP_PATTERN), extend("format" = "date-time"))]
    pub valid_until: Option<String>,

    /// The roles this one is a member of, exactly (memberships not listed are revoked),
    /// at most 16 identifiers, e.g. `pg_monitor`, `pg_read_all_data`; never `postgres` or
    /// `streaming_replica`, nor the role itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_IN_ROLES), extend("x-kubernetes-list-type" = "set", "items" = {
        "type": "string",
        "maxLength": 63,
        "pattern": formats::IDENTIFIER_PATTERN,
    }))]
    #[x_kube(validation = cel::no_forbidden_memberships())]
    pub in_roles: Vec<String>,

    /// The Secret of the cluster's namespace holding the role's password under `password`
    /// (not one of the cluster's own Secrets). Unset: the role has no password set by
    /// pgop (one set by hand is left as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<PasswordSecret>,
}

/// A Secret with a role's password (key `password`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecret {
    /// The Secret's name (an object name).
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// Whether a declared role, database, schema or extension should exist.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Ensure {
    /// It exists as declared.
    #[default]
    Present,
    /// It is dropped.
    Absent,
}

fn default_true() -> bool {
    true
}

fn default_connection_limit() -> i32 {
    -1
}

/// The state of one declared role (`status.roles`) or database (`status.databases`), as
/// the primary's manager last applied it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AppliedStatus {
    /// The role or database.
    pub name: String,
    /// PostgreSQL matches the declaration.
    pub applied: bool,
    /// Why not: PostgreSQL's error (for a database, each schema or extension refused), or
    /// the missing Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
