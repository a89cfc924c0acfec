//! The images `hack/build-images.sh` built last, as its `images.env` lists them: the
//! archives to import into real nodes and the names Pods use.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The command that builds the images, named in every error.
pub const BUILD_COMMAND: &str = "hack/build-images.sh";

#[derive(Debug, thiserror::Error)]
#[error("{0}; build the images with `{BUILD_COMMAND}` (hack/test.sh runs it)")]
pub struct MissingImages(String);

/// One image: its archive and the name it is imported under.
#[derive(Clone, Debug)]
pub struct Image {
    pub name: String,
    pub archive: PathBuf,
}

/// The pgop image, the pause image (pod sandboxes) and CoreDNS.
#[derive(Clone, Debug)]
pub struct Images {
    pub pgop: Image,
    pub pause: Image,
    pub coredns: Image,
    /// The next version of the pgop image, for upgrade tests, with the version its binary
    /// reports: built by `hack/build-images.sh --next-version` only. Not in
    /// [`Images::archives`]: the tests that need it import it themselves.
    pub next: Option<(String, Image)>,
}

impl Images {
    /// Every archive, for [`crate::real_nodes::NodesOptions::images`].
    pub fn archives(&self) -> Vec<PathBuf> {
        [&self.pause, &self.coredns, &self.pgop]
            .iter()
            .map(|i| i.archive.clone())
            .collect()
    }
}

impl Images {
    /// The next pgop image and its version, or an error naming the command that builds it.
    pub fn next(&self) -> Result<(&str, &Image), MissingImages> {
        self.next
            .as_ref()
            .map(|(version, image)| (version.as_str(), image))
            .ok_or_else(|| {
                MissingImages(format!(
                    "no next version of the pgop image (PGOP_NEXT_IMAGE in {}): build it \
                     with `{BUILD_COMMAND} --next-version`",
                    dir().join("images.env").display()
                ))
            })
    }
}

/// `$PGOP_IMAGES_DIR`, else `<cache>/images`: where the build script writes.
pub fn dir() -> PathBuf {
    match std::env::var_os("PGOP_IMAGES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => crate::binaries::cache_dir().join("images"),
    }
}

/// Reads `<cache>/images/images.env` and checks that every archive exists.
pub fn built() -> Result<Images, MissingImages> {
    let file = dir().join("images.env");
    let text = std::fs::read_to_string(&file)
        .map_err(|e| MissingImages(format!("{}: {e}", file.display())))?;
    let vars: BTreeMap<&str, &str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let image = |prefix: &str| -> Result<Image, MissingImages> {
        let get = |key: String| {
            vars.get(key.as_str())
                .map(|v| v.to_string())
                .ok_or_else(|| MissingImages(format!("{} has no {key}", file.display())))
        };
        let image = Image {
            name: get(format!("{prefix}_IMAGE"))?,
            archive: PathBuf::from(get(format!("{prefix}_IMAGE_ARCHIVE"))?),
        };
        if !image.archive.is_file() {
            return Err(MissingImages(format!(
                "{} is missing",
                image.archive.display()
            )));
        }
        Ok(image)
    };
    let next = match vars.get("PGOP_NEXT_VERSION") {
        Some(version) => Some((version.to_string(), image("PGOP_NEXT")?)),
        None => None,
    };
    Ok(Images {
        pgop: image("PGOP")?,
        pause: image("PAUSE")?,
        coredns: image("COREDNS")?,
        next,
    })
}
