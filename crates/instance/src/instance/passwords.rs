//! The roles' passwords kept equal to the cluster's Secrets.

use super::{Error, Instance};
use crate::pg::sql;

impl Instance {
    /// The passwords the cluster's `-app` and `-replication` Secrets hold now. A standby
    /// streams with the new replication password from its next configuration; the primary
    /// sets both in PostgreSQL ([`Instance::apply_passwords`]).
    pub fn set_passwords(&self, app: &str, replication: &str) {
        let mut d = self.desired();
        d.passwords.0 = app.to_string();
        d.passwords.1 = replication.to_string();
    }

    /// The superuser's password from `<cluster>-superuser` with
    /// `spec.credentials.superuserAccess`, or `None`: no password, and no network login as
    /// the superuser. pg_hba.conf follows at the next configuration
    /// ([`Instance::apply_config`]).
    pub fn set_superuser(&self, password: Option<&str>) {
        let mut d = self.desired();
        if d.passwords.2.is_some() != password.is_some() {
            // pg_hba.conf changes: written and reloaded by the next apply_config.
            d.applied = None;
        }
        d.passwords.2 = password.map(str::to_string);
    }

    /// Primary: sets the Secrets' passwords on the application and replication roles when
    /// they differ from what this manager last set (once after every start of the manager),
    /// so that a Secret deleted and generated anew never disagrees with PostgreSQL.
    pub async fn apply_passwords(&self) -> Result<(), Error> {
        let passwords = {
            let d = self.desired();
            if d.passwords_set.as_ref() == Some(&d.passwords) {
                return Ok(());
            }
            d.passwords.clone()
        };
        let client = self.endpoint().connect().await.map_err(Error::Connect)?;
        let c = &self.options.credentials;
        for (role, password) in [
            (&c.app_user, &passwords.0),
            (&c.replication_user, &passwords.1),
        ] {
            let exists = client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[role])
                .await
                .map_err(Error::SetPassword)?
                .is_some();
            if exists {
                client
                    .batch_execute(&format!(
                        "ALTER ROLE {} PASSWORD {}",
                        sql::quote_ident(role),
                        sql::password_literal(password)
                    ))
                    .await
                    .map_err(Error::SetPassword)?;
            }
        }
        // The superuser: the Secret's password with superuserAccess, else none at all (no
        // password can then log it in, whatever pg_hba.conf says).
        let superuser = match &passwords.2 {
            Some(password) => sql::password_literal(password),
            None => "NULL".to_string(),
        };
        client
            .batch_execute(&format!(
                "ALTER ROLE {} PASSWORD {superuser}",
                sql::quote_ident(sql::SUPERUSER)
            ))
            .await
            .map_err(Error::SetPassword)?;
        tracing::info!(
            superuser_access = passwords.2.is_some(),
            "the roles' passwords are the Secrets' passwords"
        );
        self.desired().passwords_set = Some(passwords);
        Ok(())
    }
}
