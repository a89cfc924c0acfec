//! The passwords pgop keeps in its credentials Secrets (`<cluster>-app`,
//! `<cluster>-replication` and, with `spec.credentials.superuserAccess`,
//! `<cluster>-superuser`): generated once, or copied at every reconcile from a Secret the
//! user names (`spec.credentials.appSecret`, `.superuserSecret`), which pgop only reads.
//!
//! A user's Secret that cannot be used (missing, no `password`, another `username`) is
//! refused with a warning naming the field; the password in force stays (or, for a new
//! cluster, a generated one is used until the Secret is fixed).

use super::error::Error;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use pgop_api::constants::{
    APP_SECRET_SUFFIX, REPLICATION_SECRET_SUFFIX, SUPERUSER, SUPERUSER_SECRET_SUFFIX,
};
use pgop_api::v1beta1::PostgresClusterSpec;

/// Longest password accepted from a user's Secret, in bytes.
pub const MAX_PASSWORD_LENGTH: usize = 1024;

/// The passwords of one reconcile, and the warnings about the user's Secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Passwords {
    pub app: String,
    /// The app password comes from `spec.credentials.appSecret`: `<cluster>-app`'s
    /// `password` follows it.
    pub app_copied: bool,
    pub replication: String,
    /// With `superuserAccess` only: the superuser's password, and whether it is copied
    /// from `superuserSecret`.
    pub superuser: Option<(String, bool)>,
    /// With `spec.poolers` only: the password of the poolers' `auth_user`
    /// (`<cluster>.pooler`).
    pub pooler: Option<String>,
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Passwords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the passwords.
        f.debug_struct("Passwords")
            .field("app_copied", &self.app_copied)
            .field("superuser", &self.superuser.as_ref().map(|(_, c)| c))
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

/// The application owner's name: `spec.bootstrap.initdb.owner` (`app` by default).
pub fn app_owner(spec: &PostgresClusterSpec) -> String {
    spec.bootstrap
        .as_ref()
        .and_then(|b| b.initdb.as_ref())
        .map(|i| i.owner.clone())
        .unwrap_or_else(|| "app".to_string())
}

/// Reads the user's Secrets the spec names and chooses every password.
pub async fn plan(
    client: &Client,
    namespace: &str,
    cluster: &str,
    spec: &PostgresClusterSpec,
    secrets: &[Secret],
) -> Result<Passwords, Error> {
    let mut warnings = Vec::new();
    let mut chosen = async |field: &str,
                            brought: &Option<String>,
                            own: String,
                            username: &str|
           -> Result<(String, bool), Error> {
        if let Some(name) = brought {
            match read_password(client, namespace, name, username).await {
                Ok(password) => return Ok((password, true)),
                Err(why) => warnings.push(format!(
                    "{field}: the Secret {name} {why}; the password in force stays"
                )),
            }
        }
        Ok((password_of(secrets, &own)?, false))
    };
    let credentials = &spec.credentials;
    let (app, app_copied) = chosen(
        "spec.credentials.appSecret",
        &credentials.app_secret,
        format!("{cluster}{APP_SECRET_SUFFIX}"),
        &app_owner(spec),
    )
    .await?;
    let superuser = if credentials.superuser_access {
        Some(
            chosen(
                "spec.credentials.superuserSecret",
                &credentials.superuser_secret,
                format!("{cluster}{SUPERUSER_SECRET_SUFFIX}"),
                SUPERUSER,
            )
            .await?,
        )
    } else {
        None
    };
    Ok(Passwords {
        app,
        app_copied,
        replication: password_of(secrets, &format!("{cluster}{REPLICATION_SECRET_SUFFIX}"))?,
        superuser,
        pooler: if spec.poolers.is_empty() {
            None
        } else {
            Some(password_of(
                secrets,
                &pgop_api::pooler::identity_name(cluster),
            )?)
        },
        warnings,
    })
}

/// The password of the user's Secret `name`, checked by [`check_password`].
async fn read_password(
    client: &Client,
    namespace: &str,
    name: &str,
    username: &str,
) -> Result<String, String> {
    let found = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot be read: {e}"))?
        .ok_or_else(|| "does not exist".to_string())?;
    check_password(&found, username)
}

/// The `password` of a user's Secret: UTF-8, not empty, no NUL (PostgreSQL cannot store
/// one), at most [`MAX_PASSWORD_LENGTH`] bytes; its `username`, if any, must be
/// `username`. Messages never quote the password.
pub fn check_password(secret: &Secret, username: &str) -> Result<String, String> {
    let data = secret.data.clone().unwrap_or_default();
    if let Some(given) = data.get("username") {
        let given = String::from_utf8_lossy(&given.0);
        if given != username {
            return Err(format!(
                "has username {given:?}, but the role is {username:?} (remove the key or make \
                 it {username:?})"
            ));
        }
    }
    let raw = data
        .get("password")
        .ok_or_else(|| "has no key `password`".to_string())?;
    let password = String::from_utf8(raw.0.clone())
        .map_err(|_| "has a `password` that is not UTF-8".to_string())?;
    if password.is_empty() {
        return Err("has an empty `password`".to_string());
    }
    if password.contains('\0') {
        return Err("has a `password` with a NUL character".to_string());
    }
    if password.len() > MAX_PASSWORD_LENGTH {
        return Err(format!(
            "has a `password` longer than {MAX_PASSWORD_LENGTH} bytes"
        ));
    }
    Ok(password)
}

/// The password in an existing Secret, or a new one when the Secret does not exist yet.
fn password_of(secrets: &[Secret], name: &str) -> Result<String, Error> {
    let existing = secrets
        .iter()
        .find(|s| s.name_any() == name)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get("password"))
        .and_then(|p| String::from_utf8(p.0.clone()).ok());
    match existing {
        Some(p) => Ok(p),
        None => generate_password(),
    }
}

/// 32 random characters from [A-Za-z0-9] (about 190 bits).
fn generate_password() -> Result<String, Error> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(32);
    while out.len() < 32 {
        let mut buf = [0u8; 64];
        getrandom::fill(&mut buf).map_err(Error::GeneratePassword)?;
        // Rejection sampling keeps every character equally likely.
        for b in buf {
            if (b as usize) < 248 && out.len() < 32 {
                out.push(ALPHABET[b as usize % ALPHABET.len()] as char);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn passwords_are_32_alphanumerics_and_differ() {
        let a = generate_password().expect("password");
        let b = generate_password().expect("password");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    fn secret(pairs: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_users_password_is_checked_and_never_quoted() {
        let hostile = "p'w\"$(id)\n#=..";
        assert_eq!(
            check_password(&secret(&[("password", hostile.as_bytes())]), "app"),
            Ok(hostile.to_string()),
            "any characters but NUL: quoted where used"
        );
        assert_eq!(
            check_password(&secret(&[("username", b"app"), ("password", b"x")]), "app"),
            Ok("x".to_string())
        );
        for (data, expected) in [
            (
                secret(&[("username", b"shop"), ("password", b"s3cret")]),
                "has username \"shop\", but the role is \"app\"",
            ),
            (secret(&[("user", b"app")]), "has no key `password`"),
            (secret(&[("password", b"")]), "empty"),
            (secret(&[("password", b"s3\0cret")]), "NUL"),
            (secret(&[("password", &[0xff, 0xfe])]), "not UTF-8"),
            (secret(&[("password", &[b'a'; 1025])]), "longer than 1024"),
        ] {
            let err = check_password(&data, "app").expect_err(expected);
            assert!(err.contains(expected), "{err}");
            assert!(
                !err.contains("s3cret"),
                "the password is never quoted: {err}"
            );
        }
    }
}
