//! `kubectl pgop report`: what support needs about a cluster, as the files of a tarball.

use super::Error;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use pgop_api::v1beta1::PostgresCluster;

/// The files of `report`: name and content.
pub async fn files(
    client: &Client,
    ns: &str,
    c: &PostgresCluster,
) -> Result<Vec<(String, Vec<u8>)>, Error> {
    use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Secret, Service};
    let name = c.name_any();
    let selector = ListParams::default().labels(&format!("{}={name}", pgop_api::labels::CLUSTER));
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut cluster = c.clone();
    cluster.metadata.managed_fields = None;
    files.push((
        "cluster.yaml".into(),
        serde_yaml::to_string(&cluster)?.into_bytes(),
    ));
    let v = super::status::read(client, ns, c).await?;
    let mut screen = Vec::new();
    super::status::render(&v, &mut screen, false)?;
    files.push(("status.txt".into(), screen));
    files.push(("status.json".into(), serde_json::to_vec_pretty(&v)?));
    files.push((
        "backups.yaml".into(),
        yaml_list(&super::status::backups_of(client, ns, &name).await?)?,
    ));
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items;
    files.push(("pods.yaml".into(), yaml_list(&pods)?));
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items;
    files.push(("pvcs.yaml".into(), yaml_list(&claims)?));
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items;
    files.push(("services.yaml".into(), yaml_list(&services)?));
    // Secrets: which exist and their keys, never a value.
    let secrets: Vec<Secret> = Api::<Secret>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items
        .into_iter()
        .map(redact)
        .collect();
    files.push(("secrets.yaml".into(), yaml_list(&secrets)?));
    let prefix = format!("{name}-");
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|n| n == name || n.starts_with(&prefix))
        })
        .collect();
    files.push(("events.yaml".into(), yaml_list(&events)?));
    let logs = Api::<Pod>::namespaced(client.clone(), ns);
    for pod in &pods {
        let pod = pod.name_any();
        let params = kube::api::LogParams {
            tail_lines: Some(2000),
            ..Default::default()
        };
        match logs.logs(&pod, &params).await {
            Ok(text) => files.push((format!("logs/{pod}.log"), text.into_bytes())),
            Err(e) => files.push((
                format!("logs/{pod}.unavailable"),
                format!("the API server gave no log for {pod}: {e}\n").into_bytes(),
            )),
        }
    }
    Ok(files)
}

/// A Secret with every value replaced by its length (under `stringData`, readable).
fn redact(mut secret: k8s_openapi::api::core::v1::Secret) -> k8s_openapi::api::core::v1::Secret {
    secret.metadata.managed_fields = None;
    if let Some(annotations) = secret.metadata.annotations.as_mut() {
        // kubectl apply keeps the whole object, values included, in this annotation.
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    let mut redacted = std::collections::BTreeMap::new();
    for (key, value) in secret.data.take().unwrap_or_default() {
        redacted.insert(key, format!("<redacted: {} bytes>", value.0.len()));
    }
    for (key, value) in secret.string_data.take().unwrap_or_default() {
        redacted.insert(key, format!("<redacted: {} bytes>", value.len()));
    }
    secret.string_data = Some(redacted);
    secret
}

/// Objects as one YAML list, their managedFields left out.
fn yaml_list<K: kube::Resource + serde::Serialize + Clone>(items: &[K]) -> Result<Vec<u8>, Error> {
    let items: Vec<K> = items
        .iter()
        .cloned()
        .map(|mut k| {
            k.meta_mut().managed_fields = None;
            k
        })
        .collect();
    Ok(serde_yaml::to_string(&items)?.into_bytes())
}

/// An uncompressed tar archive (POSIX ustar) of `files` under `report/`, every file mode
/// 0644 and time `mtime`.
pub fn tar(files: &[(String, Vec<u8>)], mtime: i64) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content) in files {
        let mut header = [0u8; 512];
        let path = format!("report/{name}");
        let field = |header: &mut [u8; 512], at: usize, len: usize, value: &[u8]| {
            let n = value.len().min(len);
            header[at..at + n].copy_from_slice(&value[..n]);
        };
        field(&mut header, 0, 100, path.as_bytes());
        field(&mut header, 100, 8, b"0000644\0");
        field(&mut header, 108, 8, b"0000000\0");
        field(&mut header, 116, 8, b"0000000\0");
        field(
            &mut header,
            124,
            12,
            format!("{:011o}\0", content.len()).as_bytes(),
        );
        field(
            &mut header,
            136,
            12,
            format!("{:011o}\0", mtime.max(0)).as_bytes(),
        );
        header[156] = b'0';
        field(&mut header, 257, 8, b"ustar\x0000");
        // The checksum is computed with its own field as spaces.
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        field(&mut header, 148, 8, format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(content);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}
