//! Running one pod as local processes: the part of kubelet the local node plays.
//!
//! A worker task per pod starts its (single) container as a process — the container's
//! command with the local pgop binary in place of `command[0]`, the pod's environment
//! (downward API and Secret references resolved), volume paths mapped to local
//! directories, the pod's `runAsUser`/`runAsGroup` — then runs its probes, restarts it
//! per the restart policy, reports status, and on deletion stops it (SIGTERM, SIGKILL
//! after the grace period) and removes the pod object.

use super::{NodeError, Shared, hosts, probe, provisioner};
use crate::process::ManagedProcess;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, PersistentVolume, PersistentVolumeClaim, Pod, Probe,
    ProjectedVolumeSource, Secret, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::container::{
    Mounts, POD_UID_ENV, SERVICE_ACCOUNT_MOUNT, expand, map_path, pod_dir, run_as, write_file,
};

pub struct Worker {
    shared: Arc<Shared>,
    pod: watch::Receiver<Pod>,
    ip: Ipv4Addr,
    dir: PathBuf,
    process: Option<ManagedProcess>,
    restarts: i32,
    started_at: Option<String>,
    last_exit: Option<(i32, String)>,
    next_start: Instant,
    ready: bool,
    ever_ready: bool,
    liveness_failures: i32,
    readiness_failures: i32,
    last_probe: Instant,
    last_status: Option<serde_json::Value>,
    waiting: Option<(String, String)>,
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

impl Worker {
    pub fn new(shared: Arc<Shared>, pod: watch::Receiver<Pod>, ip: Ipv4Addr) -> Self {
        let uid = pod.borrow().uid().unwrap_or_default();
        let dir = pod_dir(&shared.root, &uid);
        Self {
            shared,
            pod,
            ip,
            dir,
            process: None,
            restarts: 0,
            started_at: None,
            last_exit: None,
            next_start: Instant::now(),
            ready: false,
            ever_ready: false,
            liveness_failures: 0,
            readiness_failures: 0,
            last_probe: Instant::now(),
            last_status: None,
            waiting: None,
        }
    }

    fn container(&self) -> Option<Container> {
        self.pod
            .borrow()
            .spec
            .as_ref()
            .and_then(|s| s.containers.first().cloned())
    }

    /// Runs the pod until it is deleted (or the node stops).
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = tick.tick() => {},
                changed = self.pod.changed() => {
                    if changed.is_err() {
                        // The node dropped us: stop the process, keep the pod object.
                        self.stop_process(Duration::from_secs(2)).await;
                        return;
                    }
                }
            }
            let pod = self.pod.borrow().clone();
            if pod.metadata.deletion_timestamp.is_some() {
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .unwrap_or(30)
                    .max(0) as u64;
                self.stop_process(Duration::from_secs(grace)).await;
                self.finish(&pod).await;
                return;
            }
            self.step(&pod).await;
            if let Err(e) = self.report(&pod).await {
                tracing::debug!(pod = %pod.name_any(), error = %e, "status update failed");
            }
        }
    }

    async fn step(&mut self, pod: &Pod) {
        let Some(container) = self.container() else {
            return;
        };
        // A process that exited: record it and schedule a restart per the policy.
        if let Some(p) = self.process.as_mut()
            && let Some(status) = p.try_exited()
        {
            let code = status.code().unwrap_or(-1);
            let reason = if status.success() {
                "Completed"
            } else {
                "Error"
            };
            self.last_exit = Some((code, reason.to_string()));
            self.process = None;
            self.ready = false;
            let policy = pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                .unwrap_or("Always");
            let restart = policy == "Always" || (policy == "OnFailure" && !status.success());
            if restart {
                self.restarts += 1;
                let backoff =
                    Duration::from_millis(500 * 2u64.pow(self.restarts.clamp(0, 5) as u32))
                        .min(Duration::from_secs(10));
                self.next_start = Instant::now() + backoff;
                self.waiting = Some((
                    "CrashLoopBackOff".into(),
                    format!("restarting in {backoff:?} (exit code {code})"),
                ));
            } else {
                self.next_start = Instant::now() + Duration::from_secs(86_400 * 365);
            }
        }
        if self.process.is_none() && Instant::now() >= self.next_start {
            match self.start(pod, &container).await {
                Ok(p) => {
                    self.process = Some(p);
                    self.started_at = Some(now_rfc3339());
                    self.waiting = None;
                    self.readiness_failures = 0;
                    self.liveness_failures = 0;
                    self.ever_ready = false;
                }
                Err(e) => {
                    let mut msg = e.to_string();
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        msg = format!("{msg}: {s}");
                        source = s.source();
                    }
                    self.waiting = Some(("CreateContainerError".into(), msg));
                    self.next_start = Instant::now() + Duration::from_secs(2);
                }
            }
        }
        if self.process.is_some() {
            self.probe(&container).await;
        }
    }

    async fn probe(&mut self, c: &Container) {
        let period = c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.period_seconds)
            .unwrap_or(10)
            .max(1);
        // Probe at least every second so tests and failover see changes quickly; the
        // thresholds still count in the pod's own periods.
        let every = Duration::from_secs(period.min(1) as u64);
        if self.last_probe.elapsed() < every {
            return;
        }
        self.last_probe = Instant::now();
        if let Some(p) = &c.readiness_probe {
            let ok = self.check(c, p).await;
            if ok {
                self.readiness_failures = 0;
                self.ready = true;
                self.ever_ready = true;
            } else {
                self.readiness_failures += 1;
                if self.readiness_failures >= p.failure_threshold.unwrap_or(3).max(1) {
                    self.ready = false;
                }
            }
        } else {
            self.ready = true;
        }
        // Liveness counts only once the container has been ready: the startup probe's
        // job (slow bootstraps) is covered by not killing what never started.
        if let Some(p) = &c.liveness_probe {
            if self.ever_ready && !self.check(c, p).await {
                self.liveness_failures += 1;
                if self.liveness_failures >= p.failure_threshold.unwrap_or(3).max(1)
                    && let Some(mut proc_) = self.process.take()
                {
                    let _ = tokio::task::spawn_blocking(move || {
                        proc_.terminate(Duration::from_secs(5))
                    })
                    .await;
                }
            } else {
                self.liveness_failures = 0;
            }
        }
    }

    async fn check(&self, c: &Container, p: &Probe) -> bool {
        let Some(http) = &p.http_get else { return true };
        let port = match &http.port {
            IntOrString::Int(n) => u16::try_from(*n).ok(),
            IntOrString::String(name) => c
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .and_then(|cp| u16::try_from(cp.container_port).ok()),
        };
        let Some(port) = port else { return false };
        let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
        probe::http_get(
            &self.ip.to_string(),
            port,
            http.path.as_deref().unwrap_or("/"),
            timeout,
        )
        .await
    }

    async fn start(&self, pod: &Pod, c: &Container) -> Result<ManagedProcess, NodeError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| NodeError::io(&self.dir, e))?;
        let (uid, gid) = run_as(pod, c);
        let mounts = self.mounts(pod, c, uid, gid).await?;
        let mut env = self.env(pod, c).await?;
        for value in env.values_mut() {
            *value = map_path(value, &mounts);
        }
        env.insert(
            hosts::HOSTS_FILE_ENV.to_string(),
            self.shared.hosts_file.display().to_string(),
        );
        // Markers every descendant inherits: see `process::kill_tagged`.
        env.insert(POD_UID_ENV.to_string(), pod.uid().unwrap_or_default());
        env.insert(
            crate::process::OWNER_ENV.to_string(),
            self.shared.plane_dir.display().to_string(),
        );
        if let Some(kubeconfig) = self.write_kubeconfig(&mounts)? {
            env.insert("KUBECONFIG".to_string(), kubeconfig.display().to_string());
        }
        let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
        argv.extend(c.args.clone().unwrap_or_default());
        let argv: Vec<String> = argv
            .iter()
            .map(|a| map_path(&expand(a, &env), &mounts))
            .collect();
        if argv.is_empty() {
            return Err(NodeError::Unsupported(
                "a container without command (image entrypoints are unknown here)".into(),
            ));
        }
        let mut cmd = Command::new(&self.shared.pgop_binary);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(&env)
            .current_dir(&self.dir);
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        if let Some(uid) = uid {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        }
        if let Some(gid) = gid {
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        let log = self.dir.join(format!("{}.log", c.name));
        ManagedProcess::spawn(&format!("pod/{}", pod.name_any()), cmd, &log)
            .map_err(|e| NodeError::io(&log, e))
    }

    /// A kubeconfig with the pod's service-account token, when the pod mounts one.
    fn write_kubeconfig(&self, mounts: &Mounts) -> Result<Option<PathBuf>, NodeError> {
        let Some((_, dir)) = mounts.iter().find(|(m, _)| m == SERVICE_ACCOUNT_MOUNT) else {
            return Ok(None);
        };
        let path = self.dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {dir}/ca.crt\nusers:\n- name: pod\n  user:\n    tokenFile: {dir}/token\ncontexts:\n- name: pod\n  context: {{cluster: local, user: pod}}\ncurrent-context: pod\n",
            server = self.shared.server,
            dir = dir.display()
        );
        write_file(&path, &text)?;
        Ok(Some(path))
    }

    /// Volume mounts as local directories, owned by the pod's user.
    async fn mounts(
        &self,
        pod: &Pod,
        c: &Container,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<Mounts, NodeError> {
        let ns = pod.namespace().unwrap_or_default();
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        for m in c.volume_mounts.iter().flatten() {
            let v = volumes.iter().find(|v| v.name == m.name).ok_or_else(|| {
                NodeError::Unsupported(format!("volume {} is not defined", m.name))
            })?;
            let base = if let Some(claim) = &v.persistent_volume_claim {
                let pvc = Api::<PersistentVolumeClaim>::namespaced(self.shared.client.clone(), &ns)
                    .get(&claim.claim_name)
                    .await
                    .map_err(|e| NodeError::api("get PVC", e))?;
                let pv_name = pvc.spec.and_then(|s| s.volume_name).ok_or_else(|| {
                    NodeError::Unsupported(format!("PVC {} is not bound yet", claim.claim_name))
                })?;
                let pv = Api::<PersistentVolume>::all(self.shared.client.clone())
                    .get(&pv_name)
                    .await
                    .map_err(|e| NodeError::api("get PV", e))?;
                provisioner::host_path(&pv).ok_or_else(|| {
                    NodeError::Unsupported(format!("PV {pv_name} is not a local directory"))
                })?
            } else if v.empty_dir.is_some() {
                self.dir.join("v").join(&v.name)
            } else if let Some(projected) = &v.projected {
                let dir = self.dir.join("v").join(&v.name);
                self.project(pod, projected, &dir).await?;
                dir
            } else {
                return Err(NodeError::Unsupported(format!(
                    "volume {} has a type the local node does not run",
                    v.name
                )));
            };
            let path = match &m.sub_path {
                Some(sub) if !sub.is_empty() => base.join(sub),
                _ => base,
            };
            std::fs::create_dir_all(&path).map_err(|e| NodeError::io(&path, e))?;
            let fs_group = pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.fs_group)
                .and_then(|g| u32::try_from(g).ok());
            if uid.is_some() || fs_group.is_some() || gid.is_some() {
                std::os::unix::fs::chown(&path, uid, fs_group.or(gid))
                    .map_err(|e| NodeError::io(&path, e))?;
            }
            out.push((m.mount_path.clone(), path));
        }
        // Longest mount path first, so nested mounts win.
        out.sort_by_key(|m| std::cmp::Reverse(m.0.len()));
        Ok(out)
    }

    /// The projected service-account volume kube-apiserver adds to every pod: a token
    /// from the TokenRequest API, the cluster CA and the namespace. The same token goes
    /// into a kubeconfig named by `KUBECONFIG` (see [`Worker::start`]), because programs
    /// read the in-cluster files from fixed paths that cannot be remapped here.
    async fn project(
        &self,
        pod: &Pod,
        projected: &ProjectedVolumeSource,
        dir: &std::path::Path,
    ) -> Result<(), NodeError> {
        let ns = pod.namespace().unwrap_or_default();
        std::fs::create_dir_all(dir).map_err(|e| NodeError::io(dir, e))?;
        for source in projected.sources.iter().flatten() {
            if let Some(t) = &source.service_account_token {
                let token = self.token(pod, t.audience.clone()).await?;
                write_file(&dir.join(&t.path), &token)?;
            }
            if let Some(cm) = &source.config_map {
                let map = Api::<ConfigMap>::namespaced(self.shared.client.clone(), &ns)
                    .get(&cm.name)
                    .await
                    .map_err(|e| NodeError::api("get ConfigMap", e))?;
                let data = map.data.unwrap_or_default();
                for item in cm.items.iter().flatten() {
                    write_file(
                        &dir.join(&item.path),
                        data.get(&item.key).map(String::as_str).unwrap_or_default(),
                    )?;
                }
            }
            if let Some(d) = &source.downward_api {
                for item in d.items.iter().flatten() {
                    if let Some(f) = &item.field_ref {
                        write_file(&dir.join(&item.path), &self.field(pod, &f.field_path)?)?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn token(&self, pod: &Pod, audience: Option<String>) -> Result<String, NodeError> {
        let ns = pod.namespace().unwrap_or_default();
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.into_iter().collect(),
                expiration_seconds: Some(86_400),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..TokenRequest::default()
        };
        let answer: TokenRequest =
            Api::<ServiceAccount>::namespaced(self.shared.client.clone(), &ns)
                .create_subresource("token", &sa, &PostParams::default(), &request)
                .await
                .map_err(|e| NodeError::api("request a service-account token", e))?;
        answer
            .status
            .map(|s| s.token)
            .ok_or_else(|| NodeError::Internal("the token request returned no token".into()))
    }

    async fn env(&self, pod: &Pod, c: &Container) -> Result<BTreeMap<String, String>, NodeError> {
        let mut env = BTreeMap::new();
        for EnvVar {
            name,
            value,
            value_from,
        } in c.env.iter().flatten()
        {
            let v = if let Some(v) = value {
                expand(v, &env)
            } else if let Some(from) = value_from {
                if let Some(f) = &from.field_ref {
                    self.field(pod, &f.field_path)?
                } else if let Some(s) = &from.secret_key_ref {
                    let secret = Api::<Secret>::namespaced(
                        self.shared.client.clone(),
                        &pod.namespace().unwrap_or_default(),
                    )
                    .get(&s.name)
                    .await
                    .map_err(|e| NodeError::api("get Secret", e))?;
                    let bytes = secret
                        .data
                        .and_then(|d| d.get(&s.key).cloned())
                        .map(|b| b.0)
                        .unwrap_or_default();
                    String::from_utf8_lossy(&bytes).into_owned()
                } else {
                    return Err(NodeError::Unsupported(format!(
                        "env {name}: only fieldRef and secretKeyRef are resolved here"
                    )));
                }
            } else {
                String::new()
            };
            env.insert(name.clone(), v);
        }
        Ok(env)
    }

    fn field(&self, pod: &Pod, path: &str) -> Result<String, NodeError> {
        let m = &pod.metadata;
        Ok(match path {
            "metadata.name" => m.name.clone().unwrap_or_default(),
            "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
            "metadata.uid" => m.uid.clone().unwrap_or_default(),
            "spec.nodeName" => self.shared.node.clone(),
            "spec.serviceAccountName" => pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            "status.podIP" => self.ip.to_string(),
            "status.hostIP" => "127.0.0.1".to_string(),
            other => {
                let (map, key) = if let Some(k) = other.strip_prefix("metadata.labels['") {
                    (m.labels.as_ref(), k)
                } else if let Some(k) = other.strip_prefix("metadata.annotations['") {
                    (m.annotations.as_ref(), k)
                } else {
                    return Err(NodeError::Unsupported(format!("fieldRef {other}")));
                };
                let key = key.trim_end_matches("']");
                map.and_then(|m| m.get(key).cloned()).unwrap_or_default()
            }
        })
    }

    async fn stop_process(&mut self, grace: Duration) {
        if let Some(mut p) = self.process.take() {
            let _ = tokio::task::spawn_blocking(move || p.terminate(grace)).await;
        }
        self.kill_leftovers().await;
    }

    /// Whatever the container's main process left running (a container runtime kills
    /// all of a container's processes when its main process ends).
    async fn kill_leftovers(&self) {
        let uid = self.pod.borrow().uid().unwrap_or_default();
        if !uid.is_empty() {
            let _ =
                tokio::task::spawn_blocking(move || crate::process::kill_tagged(POD_UID_ENV, &uid))
                    .await;
        }
    }

    /// The pod is gone from this node: free its address and remove the object.
    async fn finish(&mut self, pod: &Pod) {
        self.shared.ips.release(self.ip);
        let api: Api<Pod> = Api::namespaced(
            self.shared.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let _ = api.delete(&pod.name_any(), &params).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Patches the pod status when what the node observes changed.
    async fn report(&mut self, pod: &Pod) -> Result<(), NodeError> {
        let Some(c) = self.container() else {
            return Ok(());
        };
        let running = self.process.is_some();
        let state = if running {
            serde_json::json!({"running": {"startedAt": self.started_at}})
        } else if let Some((reason, message)) = &self.waiting {
            serde_json::json!({"waiting": {"reason": reason, "message": message}})
        } else {
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let last = self.last_exit.as_ref().map(|(code, reason)| serde_json::json!({"terminated": {"exitCode": code, "reason": reason}}));
        let ready = running && self.ready;
        let t = |b: bool| if b { "True" } else { "False" };
        let status = serde_json::json!({
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip.to_string(),
            "podIPs": [{"ip": self.ip.to_string()}],
            "startTime": pod.status.as_ref().and_then(|s| s.start_time.clone()).map(|t| t.0.to_string()).unwrap_or_else(now_rfc3339),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": t(ready)},
                {"type": "Ready", "status": t(ready)}
            ],
            "containerStatuses": [{
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": ready,
                "started": running,
                "restartCount": self.restarts,
                "state": state,
                "lastState": last.unwrap_or_else(|| serde_json::json!({})),
            }]
        });
        if self.last_status.as_ref() == Some(&status) {
            return Ok(());
        }
        // Transition times move only when a condition's status does.
        let mut patch = status.clone();
        let now = now_rfc3339();
        if let Some(conds) = patch["conditions"].as_array_mut() {
            for cond in conds {
                let type_ = cond["type"].as_str().unwrap_or_default().to_string();
                let old = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == type_).cloned());
                let time = match old {
                    Some(o) if Some(o.status.as_str()) == cond["status"].as_str() => {
                        o.last_transition_time.map(|t| t.0.to_string())
                    }
                    _ => None,
                }
                .unwrap_or_else(|| now.clone());
                cond["lastTransitionTime"] = serde_json::Value::String(time);
            }
        }
        let api: Api<Pod> = Api::namespaced(
            self.shared.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        api.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": patch})),
        )
        .await
        .map_err(|e| NodeError::api("patch pod status", e))?;
        self.last_status = Some(status);
        Ok(())
    }
}
