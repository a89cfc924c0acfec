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
    Ok(Images {
        pgop: image("PGOP")?,
        pause: image("PAUSE")?,
        coredns: image("COREDNS")?,
    })
}
