//! `spec.databases`: PostgreSQL databases declared in the cluster spec, with their
//! schemas and extensions, which the primary's instance manager makes PostgreSQL match
//! (`CREATE DATABASE` / `ALTER DATABASE`, `CREATE SCHEMA` / `ALTER SCHEMA ... OWNER TO`,
//! `CREATE EXTENSION` / `ALTER EXTENSION ... UPDATE TO`, and the `DROP`s for
//! `ensure: absent`). Databases, schemas and extensions the spec does not name are left
//! alone; one removed from the spec is kept (retain): only `ensure: absent` drops, and a
//! drop PostgreSQL refuses (a database with sessions, a schema that is not empty, an
//! extension others depend on) is reported, never forced.
//!
//! Every schema rule here has a twin in [`crate::validation`], like the rest of the spec.

use crate::cel;
use crate::formats;
use crate::roles::Ensure;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most databases in `spec.databases`.
pub const MAX_DATABASES: usize = 16;
/// Most schemas in one database's `schemas`.
pub const MAX_SCHEMAS: usize = 16;
/// Most extensions in one database's `extensions`.
pub const MAX_EXTENSIONS: usize = 16;
pub use crate::reserved::{FORBIDDEN_OWNERS, RESERVED_SCHEMAS};

/// One PostgreSQL database declared in the spec.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = cel::unreserved_name("name"))]
#[x_kube(validation = cel::usable_owner("owner"))]
pub struct DatabaseSpec {
    /// The database's name: a lower-case identifier (`^[a-z_][a-z0-9_]{0,62}$`), not one
    /// PostgreSQL or pgop keeps (`postgres`, `template0`, `template1`, `pg_*`, ...). It may
    /// be the application database of `spec.bootstrap.initdb`, to give it schemas and
    /// extensions, but that one is never dropped.
    #[schemars(length(min = 1, max = 63), pattern(formats::IDENTIFIER_PATTERN))]
    pub name: String,

    /// `present` (the default): the database exists with this owner, connection limit,
    /// schemas and extensions; `absent`: it is dropped (`DROP DATABASE`, refused by
    /// PostgreSQL while sessions are connected: reported, not forced).
    #[serde(default)]
    pub ensure: Ensure,

    /// The role that owns the database: an identifier, an existing role (one of
    /// `spec.roles`, the application owner, `postgres`), never `streaming_replica` or a
    /// `pg_*` role.
    #[schemars(length(min = 1, max = 63), pattern(formats::IDENTIFIER_PATTERN))]
    pub owner: String,

    /// The encoding at creation (`ENCODING`, e.g. `UTF8`; the default: the cluster's,
    /// `UTF8`). Set only when the database is created: a different encoding of an
    /// existing database is reported, not changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), pattern(formats::ENCODING_PATTERN))]
    pub encoding: Option<String>,

    /// The locale at creation (`LOCALE`: both `LC_COLLATE` and `LC_CTYPE`, e.g. `C`,
    /// `C.UTF-8`, `en_US.UTF-8`; the default: the cluster's). Set only when the database is
    /// created, from `template0`; a different locale of an existing database is reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(formats::LOCALE_PATTERN))]
    pub locale: Option<String>,

    /// `CONNECTION LIMIT`: -1 (the default) for no limit, else 0 to 100000.
    #[serde(default = "default_connection_limit")]
    #[schemars(range(min = -1, max = crate::roles::MAX_CONNECTION_LIMIT))]
    pub connection_limit: i32,

    /// Schemas of the database, at most 16: created with their owner (default: the
    /// database's owner), dropped with `ensure: absent` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_SCHEMAS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub schemas: Vec<SchemaSpec>,

    /// Extensions of the database, at most 16: created (`CREATE EXTENSION`) in their
    /// schema, updated to their version, dropped with `ensure: absent` when nothing
    /// depends on them. The extension must be installed on the instances' PostgreSQL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_EXTENSIONS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub extensions: Vec<ExtensionSpec>,
}

/// A schema of a declared database.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = cel::unreserved_schema_name())]
#[x_kube(validation = cel::usable_owner("owner"))]
pub struct SchemaSpec {
    /// The schema's name: a lower-case identifier, not `public`, `information_schema` or
    /// `pg_*` (nor the other names of [`crate::reserved::RESERVED_NAMES`]).
    #[schemars(length(min = 1, max = 63), pattern(formats::IDENTIFIER_PATTERN))]
    pub name: String,

    /// `present` (the default) or `absent` (`DROP SCHEMA`, refused while it holds objects).
    #[serde(default)]
    pub ensure: Ensure,

    /// The role that owns the schema (default: the database's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(formats::IDENTIFIER_PATTERN))]
    pub owner: Option<String>,
}

/// An extension of a declared database.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionSpec {
    /// The extension's name as PostgreSQL lists it in `pg_available_extensions`: lower-case
    /// letters, digits, `_` and `-` (`pgcrypto`, `pg_trgm`, `uuid-ossp`).
    #[schemars(length(min = 1, max = 63), pattern(formats::EXTENSION_NAME_PATTERN))]
    pub name: String,

    /// `present` (the default) or `absent` (`DROP EXTENSION`, refused while other objects
    /// depend on it).
    #[serde(default)]
    pub ensure: Ensure,

    /// The version to create or update to (`ALTER EXTENSION ... UPDATE TO`); unset: the
    /// default version at creation, and whatever it is afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(formats::EXTENSION_VERSION_PATTERN))]
    pub version: Option<String>,

    /// The schema to create the extension in (it must exist: `public`, or one of
    /// `schemas`), and to move it to (`ALTER EXTENSION ... SET SCHEMA`, for extensions
    /// that can move); unset: the extension's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(formats::IDENTIFIER_PATTERN))]
    pub schema: Option<String>,
}

fn default_connection_limit() -> i32 {
    -1
}

/// Whether `name` may own a declared database or schema (see [`FORBIDDEN_OWNERS`]).
pub fn is_usable_owner(name: &str) -> bool {
    !FORBIDDEN_OWNERS.contains(&name) && !name.starts_with(crate::reserved::RESERVED_NAME_PREFIX)
}

/// Whether `name` may be a declared schema's name.
pub fn is_usable_schema_name(name: &str) -> bool {
    !crate::reserved::is_reserved_name(name) && !RESERVED_SCHEMAS.contains(&name)
}
