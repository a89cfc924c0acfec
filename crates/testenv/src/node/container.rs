//! The container-shaped details of running a pod here: `$(VAR)` expansion, mapping
//! container paths to local directories, the pod's user, markers and file layout.

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::NodeError;

/// Where a pod's mounts land locally: mount path in the container -> local directory.
pub type Mounts = Vec<(String, PathBuf)>;

/// A pod's directory: `<node>/p/<first 12 characters of its uid>`. Short on purpose:
/// PostgreSQL's Unix socket path, which lands in an emptyDir below it, may not exceed
/// 107 bytes.
pub fn pod_dir(root: &std::path::Path, uid: &str) -> PathBuf {
    pods_dir(root).join(uid.get(..12).unwrap_or(uid))
}

/// The directory holding every pod's directory.
pub fn pods_dir(root: &std::path::Path) -> PathBuf {
    root.join("p")
}

/// Marks every process of one pod (value: the pod's uid).
pub const POD_UID_ENV: &str = "PGOP_POD_UID";

/// Where kube-apiserver mounts the service-account token.
pub const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

pub fn write_file(path: &std::path::Path, contents: &str) -> Result<(), NodeError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| NodeError::io(parent, e))?;
    }
    std::fs::write(path, contents).map_err(|e| NodeError::io(path, e))?;
    // Readable by the pod's user, whoever it is (the directory is the pod's own).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| NodeError::io(path, e))
}

/// `runAsUser` / `runAsGroup` of the container, else of the pod.
pub fn run_as(pod: &Pod, c: &Container) -> (Option<u32>, Option<u32>) {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = c.security_context.as_ref();
    let uid = csc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    let gid = csc
        .and_then(|s| s.run_as_group)
        .or_else(|| psc.and_then(|s| s.run_as_group));
    (
        uid.and_then(|u| u32::try_from(u).ok()),
        gid.and_then(|g| u32::try_from(g).ok()),
    )
}

/// `$(VAR)` references expanded as kubelet does; `$$(VAR)` stays literal.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("$(") {
        if rest[..i].ends_with('$') {
            out.push_str(&rest[..i]);
            out.push('(');
            rest = &rest[i + 2..];
            continue;
        }
        out.push_str(&rest[..i]);
        match rest[i + 2..].find(')') {
            Some(j) => {
                let name = &rest[i + 2..i + 2 + j];
                match env.get(name) {
                    Some(v) => out.push_str(v),
                    None => out.push_str(&rest[i..i + 3 + j]),
                }
                rest = &rest[i + 3 + j..];
            }
            None => {
                out.push_str(&rest[i..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// A container path under a mount, rewritten to the mount's local directory.
pub fn map_path(value: &str, mounts: &Mounts) -> String {
    for (mount, local) in mounts {
        if value == mount {
            return local.display().to_string();
        }
        if let Some(rest) = value.strip_prefix(mount.as_str())
            && rest.starts_with('/')
        {
            return format!("{}{rest}", local.display());
        }
    }
    value.to_string()
}

pub fn uses_image(pod: &Pod, image: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        !s.containers.is_empty()
            && s.containers.iter().all(|c| {
                c.image
                    .as_deref()
                    .is_some_and(|i| i == image || (image.ends_with(':') && i.starts_with(image)))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pod_directory_is_one_level_under_the_pods_directory() {
        let root = std::path::Path::new("/tmp/node");
        let pod = pod_dir(root, "0123456789abcdef");
        assert_eq!(pod.parent(), Some(pods_dir(root).as_path()));
        assert_eq!(pod, PathBuf::from("/tmp/node/p/0123456789ab"));
    }

    #[test]
    fn variables_expand_like_kubelet() {
        let env: BTreeMap<String, String> =
            [("POD_IP".to_string(), "127.1.2.3".to_string())].into();
        assert_eq!(expand("--bind=$(POD_IP)", &env), "--bind=127.1.2.3");
        assert_eq!(expand("$$(POD_IP)", &env), "$(POD_IP)");
        assert_eq!(expand("$(MISSING)", &env), "$(MISSING)");
    }

    #[test]
    fn paths_under_a_mount_map_to_its_directory() {
        let mounts: Mounts = vec![
            (
                "/var/lib/postgresql/data".into(),
                PathBuf::from("/tmp/pv-1"),
            ),
            ("/run/postgresql".into(), PathBuf::from("/tmp/run")),
        ];
        assert_eq!(
            map_path("/var/lib/postgresql/data/pgdata", &mounts),
            "/tmp/pv-1/pgdata"
        );
        assert_eq!(map_path("/run/postgresql", &mounts), "/tmp/run");
        assert_eq!(
            map_path("/var/lib/postgresql/database", &mounts),
            "/var/lib/postgresql/database"
        );
    }
}
