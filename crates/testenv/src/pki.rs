//! A throwaway certificate authority for one control plane: the API server's serving
//! certificate, an admin client certificate in `system:masters`, and the service-account
//! signing key. Keys never leave the control plane's temporary directory.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to generate the {what} certificate")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("failed to write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Paths of the PEM files written by [`write`].
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
}

fn generating(what: &'static str) -> impl Fn(rcgen::Error) -> Error {
    move |source| Error::Generate { what, source }
}

fn put(path: PathBuf, contents: &str) -> Result<PathBuf, Error> {
    std::fs::write(&path, contents).map_err(|source| Error::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The control plane's certificate authority, kept in memory to issue client certificates
/// later (a real node's kubelet and kube-proxy).
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authority")
    }
}

impl Authority {
    /// A client certificate for `common_name` in `organizations`, written as
    /// `<dir>/<file>.crt` and `<dir>/<file>.key`; returns both paths.
    pub fn issue_client(
        &self,
        dir: &Path,
        file: &str,
        common_name: &str,
        organizations: &[&str],
    ) -> Result<(PathBuf, PathBuf), Error> {
        let key = KeyPair::generate().map_err(generating("client"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(generating("client"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for org in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generating("client"))?;
        Ok((
            put(dir.join(format!("{file}.crt")), &cert.pem())?,
            put(dir.join(format!("{file}.key")), &key.serialize_pem())?,
        ))
    }
}

/// The address real nodes reach the API server at (see `crate::nodes`): in the serving
/// certificate of every control plane, so that any plane can take real nodes.
pub const NODE_FACING_API_ADDRESS: &str = "10.250.0.1";

/// Generates every key and certificate into `dir`.
pub fn write(dir: &Path) -> Result<(Pki, Authority), Error> {
    let ca_key = KeyPair::generate().map_err(generating("CA"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(generating("CA"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "pgop-testenv-ca");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(generating("CA"))?;
    let ca_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    // The serving certificate answers to every name a client might use: loopback, the address
    // real nodes use, and the in-cluster names of the `kubernetes` Service.
    let serving_key = KeyPair::generate().map_err(generating("serving"))?;
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "10.0.0.1".to_string(),
        NODE_FACING_API_ADDRESS.to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])
    .map_err(generating("serving"))?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving
        .signed_by(&serving_key, &issuer)
        .map_err(generating("serving"))?;

    let admin_key = KeyPair::generate().map_err(generating("admin"))?;
    let mut admin = CertificateParams::new(Vec::<String>::new()).map_err(generating("admin"))?;
    admin
        .distinguished_name
        .push(DnType::CommonName, "pgop-testenv-admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin
        .signed_by(&admin_key, &issuer)
        .map_err(generating("admin"))?;

    let sa_key = KeyPair::generate().map_err(generating("service-account"))?;

    let pki = Pki {
        ca_cert: put(dir.join("ca.crt"), &ca_pem)?,
        ca_key: put(dir.join("ca.key"), &ca_key_pem)?,
        serving_cert: put(dir.join("apiserver.crt"), &serving_cert.pem())?,
        serving_key: put(dir.join("apiserver.key"), &serving_key.serialize_pem())?,
        admin_cert: put(dir.join("admin.crt"), &admin_cert.pem())?,
        admin_key: put(dir.join("admin.key"), &admin_key.serialize_pem())?,
        service_account_key: put(dir.join("sa.key"), &sa_key.serialize_pem())?,
        service_account_public_key: put(dir.join("sa.pub"), &sa_key.public_key_pem())?,
    };
    Ok((pki, Authority { issuer }))
}
