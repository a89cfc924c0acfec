//! The writer Pod: one insert per attempt through `-rw`, each attempt logged to an
//! emptyDir the test reads from the node's filesystem; and the check that every write it
//! saw acknowledged is in the table.

use super::{RealEnv, Result, client_pod, eventually, finished, infra_placement, psql_retrying};
use kube::api::PostParams;
use pgop_testenv::real_nodes::RealNodes;
use std::path::PathBuf;
use std::time::Duration;

/// One line of a writer's log.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    pub ok: bool,
    pub id: u64,
    /// Seconds since the epoch when the attempt started and ended.
    pub start: f64,
    pub end: f64,
}

/// A Pod on the infrastructure node that inserts one row per attempt through
/// `<cluster>-rw.<ns>.svc.cluster.local` (a new connection each time, by DNS name, as a
/// client would after a failover) and logs every attempt to an emptyDir the test reads.
pub struct Writer {
    pub pod: String,
    pub table: String,
    uid: String,
    node: usize,
}

pub async fn start_writer(env: &RealEnv, ns: &str, cluster: &str, table: &str) -> Result<Writer> {
    let host = format!("{cluster}-rw.{ns}.svc.cluster.local");
    start_writer_on(env, ns, cluster, table, infra_placement(), &host).await
}

/// A writer like [`start_writer`], placed by `placement` (Pod spec fields), connecting to
/// `host` (a shell word: `$DB_RW_SERVICE_HOST` reaches `-rw` by its ClusterIP without
/// DNS, from a node cut off from the DNS server).
pub async fn start_writer_on(
    env: &RealEnv,
    ns: &str,
    cluster: &str,
    table: &str,
    placement: serde_json::Value,
    host: &str,
) -> Result<Writer> {
    let name = format!("writer-{table}");
    // A ClusterIP is no name in the certificate: the chain is still verified.
    let sslmode = if host.starts_with('$') {
        "export PGSSLMODE=verify-ca\n"
    } else {
        ""
    };
    let script = format!(
        "{sslmode}host={host}
until psql -qAt -h $host -c 'create table if not exists {table} (id bigint primary key)'; do sleep 0.5; done
i=0
while [ ! -e /out/stop ]; do
  i=$((i + 1))
  t0=$(date +%s.%N)
  if timeout 3 psql -qAt -h $host -c \"insert into {table} values ($i)\" >/dev/null 2>&1; then
    echo \"ok $i $t0 $(date +%s.%N)\" >> /out/log
  else
    echo \"fail $i $t0 $(date +%s.%N)\" >> /out/log
  fi
  sleep 0.05
done
echo stopped >> /out/log
exec sleep infinity"
    );
    let pod = client_pod(
        &name,
        &env.images.pgop.name,
        &format!("{cluster}-app"),
        &script,
        placement,
    )?;
    let pods = env.pods(ns);
    let created = pods.create(&PostParams::default(), &pod).await?;
    let uid = created.metadata.uid.ok_or("no uid")?;
    let node_name = env.node_of(ns, &name).await.unwrap_or_default();
    let node = env
        .nodes
        .index_of(&node_name)
        .or_else(|| env.nodes.names().len().checked_sub(1))
        .ok_or("no nodes")?;
    let writer = Writer {
        pod: name,
        table: table.to_string(),
        uid,
        node,
    };
    eventually("the writer writes", Duration::from_secs(120), || async {
        let attempts = writer.read(&env.nodes);
        if attempts.iter().any(|a| a.ok) {
            Ok(())
        } else {
            Err(format!("{} attempts, none acknowledged", attempts.len()))
        }
    })
    .await;
    Ok(writer)
}

impl Writer {
    fn log(&self, nodes: &RealNodes) -> PathBuf {
        nodes.empty_dir(self.node, &self.uid, "out").join("log")
    }

    /// Stops the writer (a file it looks for before each attempt) and waits until it has.
    pub async fn stop(&self, nodes: &RealNodes) -> Result {
        std::fs::write(
            nodes.empty_dir(self.node, &self.uid, "out").join("stop"),
            "",
        )?;
        let log = self.log(nodes);
        eventually("the writer stops", Duration::from_secs(30), || async {
            let text = std::fs::read_to_string(&log).map_err(|e| e.to_string())?;
            if text.lines().any(|l| l == "stopped") {
                Ok(())
            } else {
                Err("still writing".to_string())
            }
        })
        .await;
        Ok(())
    }

    /// The first attempt that started after `time` (seconds since the epoch) and was
    /// acknowledged; waits up to 120 s for it.
    pub async fn first_write_after(&self, nodes: &RealNodes, time: f64) -> Attempt {
        eventually(
            "a write acknowledged after the fault",
            Duration::from_secs(120),
            || async {
                self.read(nodes)
                    .into_iter()
                    .find(|a| a.ok && a.start > time)
                    .ok_or_else(|| "none yet".to_string())
            },
        )
        .await
    }

    /// Every attempt so far.
    pub fn read(&self, nodes: &RealNodes) -> Vec<Attempt> {
        let text = std::fs::read_to_string(self.log(nodes)).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some(Attempt {
                    ok: *f.first()? == "ok",
                    id: f.get(1)?.parse().ok()?,
                    start: f.get(2)?.parse().ok()?,
                    end: f.get(3)?.parse().ok()?,
                })
            })
            .collect()
    }
}

/// Every id in `table` of `cluster`, read through `-rw` by DNS name from a Pod on the
/// infrastructure node (`reader-<table>`).
pub async fn read_ids(
    env: &RealEnv,
    ns: &str,
    cluster: &str,
    table: &str,
) -> Result<std::collections::BTreeSet<u64>> {
    let name = format!("reader-{table}");
    let reader = client_pod(
        &name,
        &env.images.pgop.name,
        &format!("{cluster}-app"),
        &format!(
            "{} && echo done > /dev/termination-log",
            psql_retrying(
                &format!("{cluster}-rw.{ns}.svc.cluster.local"),
                &format!("-c 'select id from {table} order by id' > /out/ids"),
            )
        ),
        infra_placement(),
    )?;
    let created = env.pods(ns).create(&PostParams::default(), &reader).await?;
    let (code, message) = finished(&env.pods(ns), &name, Duration::from_secs(120)).await;
    if (code, message.trim()) != (0, "done") {
        return Err(format!("{name}: exit {code}: {message}").into());
    }
    let uid = created.metadata.uid.ok_or("no uid")?;
    let node = env.node_of(ns, &name).await?;
    let index = env.nodes.index_of(&node).ok_or("the reader's node")?;
    let ids = std::fs::read_to_string(env.nodes.empty_dir(index, &uid, "out").join("ids"))?;
    Ok(ids.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Stops the writer and reads the table back through `-rw` from a Pod: the writes the
/// writer saw acknowledged, and those of them missing from the table.
pub async fn acknowledged_and_lost(
    env: &RealEnv,
    ns: &str,
    writer: &Writer,
) -> Result<(Vec<u64>, Vec<u64>)> {
    writer.stop(&env.nodes).await?;
    let acknowledged: Vec<u64> = writer
        .read(&env.nodes)
        .into_iter()
        .filter(|a| a.ok)
        .map(|a| a.id)
        .collect();
    let stored = read_ids(env, ns, "db", &writer.table).await?;
    let lost = acknowledged
        .iter()
        .copied()
        .filter(|id| !stored.contains(id))
        .collect();
    Ok((acknowledged, lost))
}

/// Stops the writer, reads the table through `-rw` from a Pod and checks that every write
/// the writer saw acknowledged is there.
pub async fn assert_no_acknowledged_write_lost(env: &RealEnv, ns: &str, writer: &Writer) -> Result {
    let (acknowledged, lost) = acknowledged_and_lost(env, ns, writer).await?;
    println!(
        "{} writes acknowledged, {} acknowledged writes lost",
        acknowledged.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(!acknowledged.is_empty());
    Ok(())
}
