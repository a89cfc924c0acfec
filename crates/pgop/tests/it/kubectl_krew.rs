//! `kubectl pgop` installed with krew (docs/kubectl.md, "Installing with krew"): this
//! build's pgop packaged by `hack/package-plugin.sh` into its archive and manifest, the
//! manifest checked by krew's `validate-krew-manifest` (which installs it, downloading the
//! archive from a local HTTP server as from a release location), then installed with
//! `krew install --manifest --archive` into a temporary `KREW_ROOT`, offline, and run
//! through kubectl (testenv's) as `kubectl pgop`. A manifest whose sha256 is not the
//! archive's makes `krew install` fail and installs nothing. No cluster is needed.
//!
//! krew and validate-krew-manifest come from `hack/install-krew.sh`; a missing one fails
//! the test with that command.

use pgop_testenv::TempDir;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const INSTALL_KREW: &str = "hack/install-krew.sh";
const ARCHIVE: &str = concat!(
    "kubectl-pgop_",
    env!("CARGO_PKG_VERSION"),
    "_linux_amd64.tar.gz"
);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A tool of `hack/install-krew.sh`: `env` if set, else its place in the cache; an error
/// naming the script when it is not there.
fn krew_tool(name: &str, env: &str) -> Result<PathBuf> {
    let path = match std::env::var_os(env) {
        Some(path) => PathBuf::from(path),
        None => pgop_testenv::binaries::cache_dir()
            .join("krew/bin")
            .join(name),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{name} not found at {}: install it with `{INSTALL_KREW}` (or set {env})",
            path.display()
        )
        .into())
    }
}

fn krew() -> Result<PathBuf> {
    krew_tool("krew", "PGOP_KREW")
}

fn validate_krew_manifest() -> Result<PathBuf> {
    krew_tool("validate-krew-manifest", "PGOP_VALIDATE_KREW_MANIFEST")
}

fn kubectl() -> Result<PathBuf> {
    pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)
        .map_err(|e| format!("{e}: run hack/install-testenv.sh").into())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `command` with no stdin; its output, or an error with it when it fails.
fn run(command: &mut Command) -> Result<Output> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("failed to run {command:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!("{command:?} failed ({}):\n{}", out.status, text(&out)).into())
    }
}

/// `hack/package-plugin.sh --binary <this build's pgop> --out DIR [--release-url URL]`:
/// the archive's and the manifest's paths.
fn package(out: &Path, release_url: Option<&str>) -> Result<(PathBuf, PathBuf)> {
    let mut command = Command::new(repo().join("hack/package-plugin.sh"));
    command
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_pgop"))
        .arg("--out")
        .arg(out)
        .env_remove("PGOP_RELEASE_URL")
        .env_remove("PGOP_HOMEPAGE");
    if let Some(url) = release_url {
        command.args(["--release-url", url]);
    }
    let stdout = String::from_utf8(run(&mut command)?.stdout)?;
    let lines: Vec<&str> = stdout.lines().collect();
    let archive = out.join(ARCHIVE);
    let manifest = out.join("pgop.yaml");
    assert_eq!(
        lines,
        [
            archive.display().to_string(),
            manifest.display().to_string()
        ],
        "package-plugin.sh's stdout"
    );
    Ok((archive, manifest))
}

/// Serves the files of `dir` over HTTP/1.0 on a loopback port, for the life of the test
/// process: the release location validate-krew-manifest downloads from. Its base URL.
fn serve(dir: PathBuf) -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let dir = dir.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut reader = BufReader::new(stream.try_clone()?);
                let mut request = String::new();
                reader.read_line(&mut request)?;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
                        break;
                    }
                }
                let name = request
                    .split_whitespace()
                    .nth(1)
                    .and_then(|path| path.strip_prefix('/'))
                    .unwrap_or_default();
                let mut stream = stream;
                match std::fs::read(dir.join(name)) {
                    Ok(body) if !name.contains('/') && !name.is_empty() => {
                        write!(
                            stream,
                            "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
                            body.len()
                        )?;
                        stream.write_all(&body)
                    }
                    _ => stream.write_all(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
                }
            });
        }
    });
    Ok(url)
}

/// What every test starts from, packaged once: this build's pgop as the archive and two
/// manifests for it, one whose uri is a local HTTP server serving the archive and one
/// with the script's placeholder uri (installable with `--archive` only). Under the
/// target directory's scratch space, replaced on each run.
struct Packaged {
    archive: PathBuf,
    served_manifest: PathBuf,
    placeholder_manifest: PathBuf,
}

fn packaged() -> Result<&'static Packaged> {
    static PACKAGED: OnceLock<std::result::Result<Packaged, String>> = OnceLock::new();
    PACKAGED
        .get_or_init(|| package_once().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| format!("packaging failed: {e}").into())
}

fn package_once() -> Result<Packaged> {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubectl_krew");
    let _ = std::fs::remove_dir_all(&root);
    let served = root.join("served");
    let placeholder = root.join("placeholder");
    let url = serve(served.clone())?;
    let (archive, served_manifest) = package(&served, Some(&url))?;
    let (second, placeholder_manifest) = package(&placeholder, None)?;
    // Reproducible: the same binary gives the same bytes, whatever the uri.
    assert!(
        std::fs::read(&archive)? == std::fs::read(&second)?,
        "two packagings of one binary gave different archives"
    );
    std::fs::remove_file(&second)?;
    Ok(Packaged {
        archive,
        served_manifest,
        placeholder_manifest,
    })
}

fn sha256(path: &Path) -> Result<String> {
    let out = run(Command::new("sha256sum").arg(path))?;
    Ok(String::from_utf8(out.stdout)?
        .split_whitespace()
        .next()
        .ok_or("no output from sha256sum")?
        .to_string())
}

/// `krew install --manifest=MANIFEST --archive=ARCHIVE` into `krew_root`, offline: no
/// index (a manifest install needs none) and no upgrade check.
fn krew_install(krew_root: &Path, manifest: &Path, archive: &Path) -> Result<Output> {
    let mut manifest_arg = std::ffi::OsString::from("--manifest=");
    manifest_arg.push(manifest);
    let mut archive_arg = std::ffi::OsString::from("--archive=");
    archive_arg.push(archive);
    Ok(Command::new(krew()?)
        .arg("install")
        .arg(manifest_arg)
        .arg(archive_arg)
        .env("KREW_ROOT", krew_root)
        .env("KREW_NO_UPGRADE_CHECK", "1")
        .env("PATH", krew_root.join("bin"))
        .stdin(Stdio::null())
        .output()?)
}

/// A directory with `kubectl` (testenv's) and, if given, krew as `kubectl-krew`.
fn tools(dir: &Path, with_krew: bool) -> Result<PathBuf> {
    let bin = dir.join("tools");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(kubectl()?, bin.join("kubectl"))?;
    if with_krew {
        std::os::unix::fs::symlink(krew()?, bin.join("kubectl-krew"))?;
    }
    Ok(bin)
}

#[test]
fn the_manifest_is_krews_and_names_the_archive() -> Result {
    let packaged = packaged()?;
    let manifest: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&packaged.served_manifest)?)?;
    assert_eq!(
        manifest["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "pgop");
    let spec = &manifest["spec"];
    assert_eq!(
        spec["version"].as_str(),
        Some(concat!("v", env!("CARGO_PKG_VERSION")))
    );
    assert!(
        spec["shortDescription"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert!(spec["description"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(spec.get("homepage").is_none(), "no homepage unless given");
    let platforms = spec["platforms"].as_sequence().ok_or("no platforms")?;
    assert_eq!(platforms.len(), 1, "{platforms:?}");
    let platform = &platforms[0];
    assert_eq!(
        platform["selector"],
        serde_yaml::from_str::<serde_yaml::Value>("matchLabels: {os: linux, arch: amd64}")?
    );
    assert_eq!(
        platform["sha256"].as_str(),
        Some(sha256(&packaged.archive)?.as_str())
    );
    let uri = platform["uri"].as_str().ok_or("no uri")?;
    assert!(
        uri.starts_with("http://127.0.0.1:") && uri.ends_with(&format!("/{ARCHIVE}")),
        "{uri}"
    );
    assert_eq!(platform["bin"], "kubectl-pgop");
    assert_eq!(
        platform["files"],
        serde_yaml::from_str::<serde_yaml::Value>(
            "[{from: kubectl-pgop, to: .}, {from: LICENSE, to: .}]"
        )?
    );
    // Without a release URL, the uri is the placeholder the docs tell to replace.
    let placeholder: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&packaged.placeholder_manifest)?)?;
    let uri = placeholder["spec"]["platforms"][0]["uri"]
        .as_str()
        .ok_or("no uri")?;
    assert!(uri.starts_with("https://example.invalid/"), "{uri}");

    // The archive: the binary as kubectl-pgop and the LICENSE note, root-owned, at the
    // epoch.
    let listing = String::from_utf8(
        run(Command::new("tar")
            .arg("-tvzf")
            .arg(&packaged.archive)
            .env("TZ", "UTC"))?
        .stdout,
    )?;
    let entries: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(entries.len(), 2, "{listing}");
    for (entry, (mode, name)) in entries
        .iter()
        .zip([("-rw-r--r--", "LICENSE"), ("-rwxr-xr-x", "kubectl-pgop")])
    {
        assert_eq!(
            (entry[0], entry[1], entry[3], entry[5]),
            (mode, "0/0", "1970-01-01", name),
            "{listing}"
        );
    }
    Ok(())
}

#[test]
fn validate_krew_manifest_accepts_the_manifest_and_installs_it_from_its_uri() -> Result {
    let packaged = packaged()?;
    let validate = validate_krew_manifest()?;
    let dir = TempDir::new("krew-validate")?;
    // validate-krew-manifest runs `kubectl krew install --manifest FILE` (downloading the
    // uri, checking the sha256 and that a LICENSE file was installed) in a KREW_ROOT of its
    // own, with the PATH it was given.
    let tools = tools(&dir.0, true)?;
    let out = run(Command::new(validate)
        .arg("-manifest")
        .arg(&packaged.served_manifest)
        .env("PATH", &tools)
        .env("TMPDIR", &dir.0))?;
    let text = text(&out);
    for line in [
        "structural validation OK",
        "installed  spec.platforms[0]",
        "all 1 spec.platforms installed fine",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    Ok(())
}

#[test]
fn krew_installs_the_archive_and_kubectl_runs_it_as_kubectl_pgop() -> Result {
    let packaged = packaged()?;
    let dir = TempDir::new("krew-install")?;
    let krew_root = dir.0.join("krew");
    let out = krew_install(
        &krew_root,
        &packaged.placeholder_manifest,
        &packaged.archive,
    )?;
    assert!(out.status.success(), "krew install failed:\n{}", text(&out));
    assert!(
        text(&out).contains("Installed plugin: pgop"),
        "{}",
        text(&out)
    );
    assert!(krew_root.join("receipts/pgop.yaml").is_file());
    let store = krew_root.join(concat!("store/pgop/v", env!("CARGO_PKG_VERSION")));
    assert!(
        std::fs::read(store.join("kubectl-pgop"))? == std::fs::read(env!("CARGO_BIN_EXE_pgop"))?,
        "the installed kubectl-pgop is not this build's pgop"
    );
    let license = std::fs::read_to_string(store.join("LICENSE"))?;
    assert!(license.contains("Apache-2.0"), "{license}");

    // kubectl finds the plugin in krew's bin directory: only there and kubectl's own
    // directory on the PATH, so that no other kubectl-pgop (a symlink of docs/kubectl.md)
    // shadows it.
    let tools = tools(&dir.0, false)?;
    let path = std::env::join_paths([krew_root.join("bin"), tools.clone()])?;
    let kubectl = |args: &[&str]| -> Result<String> {
        let out = run(Command::new(tools.join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", dir.0.join("no-kubeconfig")))?;
        Ok(String::from_utf8(out.stdout)?)
    };
    let help = kubectl(&["pgop", "--help"])?;
    for line in [
        "pgop's kubectl plugin",
        "Usage: kubectl-pgop [OPTIONS] <COMMAND>",
        "  status ",
        "  report ",
    ] {
        assert!(help.contains(line), "{line:?} not in:\n{help}");
    }
    assert_eq!(
        kubectl(&["pgop", "--version"])?.trim(),
        concat!("kubectl pgop ", env!("CARGO_PKG_VERSION"))
    );
    let list = kubectl(&["plugin", "list"])?;
    let installed = krew_root.join("bin/kubectl-pgop");
    assert!(
        list.lines()
            .any(|l| l.trim() == installed.to_str().unwrap()),
        "{} not in kubectl plugin list:\n{list}",
        installed.display()
    );
    Ok(())
}

#[test]
fn krew_refuses_an_archive_whose_sha256_is_not_the_manifests() -> Result {
    let packaged = packaged()?;
    let dir = TempDir::new("krew-sha256")?;
    let good = sha256(&packaged.archive)?;
    // Another well-formed sha256: the last hex digit changed.
    let last = good.chars().last().unwrap();
    let bad = format!(
        "{}{}",
        &good[..good.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    let manifest = std::fs::read_to_string(&packaged.placeholder_manifest)?;
    assert_eq!(manifest.matches(&good).count(), 1, "{manifest}");
    let wrong = dir.0.join("pgop.yaml");
    std::fs::write(&wrong, manifest.replace(&good, &bad))?;
    let krew_root = dir.0.join("krew");
    let out = krew_install(&krew_root, &wrong, &packaged.archive)?;
    assert!(
        !out.status.success(),
        "krew installed an archive whose sha256 is not the manifest's:\n{}",
        text(&out)
    );
    let text = text(&out);
    assert!(
        text.contains(&format!("checksum does not match, want: {bad}, got {good}")),
        "{text}"
    );
    assert!(!krew_root.join("bin/kubectl-pgop").exists());
    assert!(!krew_root.join("receipts/pgop.yaml").exists());
    Ok(())
}
