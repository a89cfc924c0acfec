//! `spec.roles` on the primary: each declared role made to match (`CREATE ROLE` or
//! `ALTER ROLE` with every attribute, the password from its Secret, memberships granted
//! and revoked to equal `inRoles`, `DROP ROLE` for `ensure: absent`). Roles not declared
//! are never touched.
//!
//! Every name is an identifier the API refused otherwise, and is quoted again here
//! ([`sql::quote_ident`]); a password reaches PostgreSQL as its SCRAM verifier only
//! ([`sql::password_literal`]). A statement PostgreSQL refuses (a role that still owns
//! objects, a membership in a role that does not exist) is reported for that role on
//! `/pg/status`, never returned as a failed pass: the same declaration is tried again at
//! most every [`RETRY_FAILED`], so a refused role costs no retry storm.

use super::{Error, Instance};
use crate::pg::sql;
use pgop_api::roles::{AppliedStatus, Ensure, RoleSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// How soon a declaration that failed for some role is applied again when nothing changed.
pub const RETRY_FAILED: Duration = Duration::from_secs(60);

/// A role's password as the manager found it: the Secret's value, or why there is none.
pub type Password = Result<String, String>;

/// When a declaration (of roles, of databases) was last applied and how each object fared:
/// the same declaration is applied again only if an object failed, and then at most every
/// [`RETRY_FAILED`].
#[derive(Debug, Default)]
pub(super) struct Gate {
    /// The declaration applied (a digest), and when.
    last: Option<(u64, Instant)>,
    /// Per object, for `/pg/status`.
    pub(super) report: Vec<AppliedStatus>,
}

impl Gate {
    /// Whether the declaration with digest `wanted` is to be applied now.
    pub(super) fn due(&self, wanted: u64) -> bool {
        match self.last {
            Some((done, _)) if done == wanted && self.report.iter().all(|r| r.applied) => false,
            Some((done, at)) if done == wanted && at.elapsed() < RETRY_FAILED => false,
            _ => true,
        }
    }

    /// Records the declaration with digest `wanted` as applied now, with `report`.
    pub(super) fn applied(&mut self, wanted: u64, report: Vec<AppliedStatus>) {
        self.last = Some((wanted, Instant::now()));
        self.report = report;
    }
}

/// What was last applied.
#[derive(Debug, Default)]
pub(super) struct Applied {
    pub(super) gate: Gate,
    /// A digest of the password this manager last set, per role.
    passwords: BTreeMap<String, u64>,
}

pub(super) fn digest(value: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

impl Instance {
    /// Primary: makes PostgreSQL's roles match `roles` (see the module doc). `passwords`
    /// holds, by role, what its `passwordSecret` gave. Only a failed connection is an error.
    pub async fn apply_roles(
        &self,
        roles: &[RoleSpec],
        passwords: &BTreeMap<String, Password>,
    ) -> Result<(), Error> {
        let wanted = digest(&(
            serde_json::to_string(roles).unwrap_or_default(),
            passwords
                .iter()
                .map(|(k, v)| (k.clone(), digest(v)))
                .collect::<Vec<_>>(),
        ));
        let mut set = {
            let d = self.desired();
            if !d.roles.gate.due(wanted) {
                return Ok(());
            }
            d.roles.passwords.clone()
        };
        let mut report = Vec::with_capacity(roles.len());
        if !roles.is_empty() {
            let client = self.endpoint().connect().await.map_err(Error::Connect)?;
            let owner = &self.options.credentials.app_user;
            // Three rounds, so that the order of the list does not matter: every present
            // role with its attributes, then the memberships (a group declared later in
            // the list exists by then), then the drops.
            let mut outcomes: Vec<Result<(), String>> = roles
                .iter()
                .map(|role| {
                    if role.name == *owner {
                        Err(format!(
                            "{:?} is the application owner, whose password pgop keeps \
                             (spec.credentials.appSecret); it is not managed as a declared role",
                            role.name
                        ))
                    } else {
                        Ok(())
                    }
                })
                .collect();
            for (role, outcome) in roles.iter().zip(outcomes.iter_mut()) {
                if outcome.is_ok() && role.ensure == Ensure::Present {
                    *outcome = present(&client, role, passwords.get(&role.name), &mut set).await;
                }
            }
            for (role, outcome) in roles.iter().zip(outcomes.iter_mut()) {
                if outcome.is_ok() && role.ensure == Ensure::Present {
                    *outcome = memberships(&client, role).await;
                }
            }
            for (role, outcome) in roles.iter().zip(outcomes.iter_mut()) {
                if outcome.is_ok() && role.ensure == Ensure::Absent {
                    *outcome = absent(&client, role, &mut set).await;
                }
            }
            for (role, outcome) in roles.iter().zip(outcomes) {
                if let Err(why) = &outcome {
                    tracing::warn!(role = %role.name, error = %why, "a declared role was not applied");
                }
                report.push(AppliedStatus {
                    name: role.name.clone(),
                    applied: outcome.is_ok(),
                    message: outcome.err(),
                });
            }
            tracing::info!(
                roles = roles.len(),
                failed = report.iter().filter(|r| !r.applied).count(),
                "applied spec.roles"
            );
        }
        let mut d = self.desired();
        d.roles.gate.applied(wanted, report);
        d.roles.passwords = set;
        Ok(())
    }
}

/// PostgreSQL's words for a refused statement: its message, with its detail.
pub(super) fn refused(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({detail})", db.message()),
            None => db.message().to_string(),
        },
        None => crate::error_chain(e),
    }
}

/// The role options of `CREATE ROLE` / `ALTER ROLE` for a declaration, every attribute
/// spelled out so that the role matches whatever it was before.
fn options(role: &RoleSpec) -> String {
    let flag = |on: bool, name: &str| {
        if on {
            name.to_string()
        } else {
            format!("NO{name}")
        }
    };
    let until = role
        .valid_until
        .as_deref()
        .map_or_else(|| sql::quote_literal("infinity"), sql::quote_literal);
    format!(
        "{} {} {} {} {} CONNECTION LIMIT {} VALID UNTIL {until}",
        flag(role.login, "LOGIN"),
        flag(role.superuser, "SUPERUSER"),
        flag(role.createdb, "CREATEDB"),
        flag(role.createrole, "CREATEROLE"),
        flag(role.inherit, "INHERIT"),
        role.connection_limit,
    )
}

/// `ensure: absent`: the role dropped if it exists.
async fn absent(
    client: &Client,
    role: &RoleSpec,
    set: &mut BTreeMap<String, u64>,
) -> Result<(), String> {
    client
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {}",
            sql::quote_ident(&role.name)
        ))
        .await
        .map_err(|e| refused(&e))?;
    set.remove(&role.name);
    Ok(())
}

/// `ensure: present`: the role created or altered to its declared attributes and password.
async fn present(
    client: &Client,
    role: &RoleSpec,
    password: Option<&Password>,
    set: &mut BTreeMap<String, u64>,
) -> Result<(), String> {
    let ident = sql::quote_ident(&role.name);
    let password = match password {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(why)) => return Err(why.clone()),
    };
    let exists = client
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role.name])
        .await
        .map_err(|e| refused(&e))?
        .is_some();
    let mut statement = format!(
        "{} ROLE {ident} WITH {}",
        if exists { "ALTER" } else { "CREATE" },
        options(role)
    );
    // The password only when it is new to this manager (or the role is): its verifier has
    // a random salt, so setting it again would change the role at every pass.
    let new_password = password
        .map(|p| (p, digest(p)))
        .filter(|(_, d)| !exists || set.get(&role.name) != Some(d));
    if let Some((p, _)) = new_password {
        statement.push_str(&format!(" PASSWORD {}", sql::password_literal(p)));
    }
    client
        .batch_execute(&statement)
        .await
        .map_err(|e| refused(&e))?;
    if let Some((_, d)) = new_password {
        set.insert(role.name.clone(), d);
    }
    Ok(())
}

/// The role's memberships made equal to `inRoles`.
async fn memberships(client: &Client, role: &RoleSpec) -> Result<(), String> {
    let ident = sql::quote_ident(&role.name);
    let rows = client
        .query(
            "SELECT DISTINCT g.rolname::text FROM pg_auth_members m \
             JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles u ON u.oid = m.member \
             WHERE u.rolname = $1",
            &[&role.name],
        )
        .await
        .map_err(|e| refused(&e))?;
    let current: BTreeSet<String> = rows
        .iter()
        .filter_map(|r| r.try_get::<_, String>(0).ok())
        .collect();
    for group in &role.in_roles {
        if !current.contains(group) {
            client
                .batch_execute(&format!("GRANT {} TO {ident}", sql::quote_ident(group)))
                .await
                .map_err(|e| refused(&e))?;
        }
    }
    for group in current.iter().filter(|g| !role.in_roles.contains(g)) {
        client
            .batch_execute(&format!("REVOKE {} FROM {ident}", sql::quote_ident(group)))
            .await
            .map_err(|e| refused(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_is_spelled_out_and_values_are_quoted() {
        let role: RoleSpec = serde_json::from_value(serde_json::json!({
            "name": "reporting", "login": true, "connectionLimit": 5,
            "validUntil": "2027-01-31T00:00:00Z"
        }))
        .expect("role");
        assert_eq!(
            options(&role),
            "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE INHERIT CONNECTION LIMIT 5 \
             VALID UNTIL '2027-01-31T00:00:00Z'"
        );
        let group: RoleSpec =
            serde_json::from_value(serde_json::json!({"name": "readers", "inherit": false}))
                .expect("role");
        assert_eq!(
            options(&group),
            "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT CONNECTION LIMIT -1 \
             VALID UNTIL 'infinity'"
        );
        // Whatever slipped past the API is still one quoted literal.
        let mut odd = role.clone();
        odd.valid_until = Some("x'; DROP ROLE postgres; --".into());
        assert!(options(&odd).ends_with("VALID UNTIL 'x''; DROP ROLE postgres; --'"));
    }
}
