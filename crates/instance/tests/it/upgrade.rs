//! In-place major upgrades (PostgreSQL 15 to 18, `hack/install-postgres18.sh`) with
//! pg_upgrade on real servers: data made by pgop's bootstrap on 15 is upgraded with
//! [`upgrade::upgrade`] and started by a manager on 18; a refused upgrade leaves 15's data
//! directory as it was; interrupted attempts and crashed clusters converge. Each test has
//! its own directories and port, and leaves no server or directory behind.

use crate::postgres::common::{self, TempDir, TestResult, credentials, free_port, run_as};
use pgop_instance::upgrade::{self, Mode as UpgradeMode, Outcome};
use pgop_instance::{Binaries, DataState, Instance, Layout, Mode, Options};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn fifteen() -> Binaries {
    Binaries::for_major(15, None).unwrap_or_else(|e| {
        panic!("PostgreSQL 15 is missing: run hack/install-packages.sh demo ({e})")
    })
}

fn eighteen() -> Binaries {
    Binaries::for_major(18, None).unwrap_or_else(|e| {
        panic!("PostgreSQL 18 is missing: run hack/install-postgres18.sh ({e})")
    })
}

/// One instance's directories and port: `data/pgdata` (with room beside it for the
/// upgrade's directories) and the socket directory `run`.
struct Site {
    dir: TempDir,
    port: u16,
}

impl Site {
    fn new(name: &str) -> Self {
        let dir = TempDir::new(name);
        common::make_dir(&dir.0.join("data"));
        common::make_dir(&dir.0.join("run"));
        Self {
            dir,
            port: free_port(),
        }
    }

    fn pgdata(&self) -> PathBuf {
        self.dir.0.join("data/pgdata")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.0.join("run")
    }

    /// The manager of instance `db-1` on this site's PostgreSQL with `binaries`.
    fn server(&self, binaries: Binaries) -> Server {
        self.named("db-1", binaries)
    }

    /// A manager of instance `name` on this site's PostgreSQL with `binaries` (a crash is
    /// not restarted).
    fn named(&self, name: &str, binaries: Binaries) -> Server {
        Server(Arc::new(Instance::new(Options {
            layout: Layout {
                instance: name.into(),
                cluster: "it".into(),
                pgdata: self.pgdata(),
                listen_addresses: "127.0.0.1".into(),
                port: self.port,
                socket_dir: self.socket_dir(),
                wal_dir: None,
            },
            binaries,
            run_as: run_as(),
            credentials: credentials(),
            stop_timeout: Duration::from_secs(10),
            start_timeout: Duration::from_secs(60),
            forward_logs: std::env::var_os("PGOP_TEST_LOGS").is_some(),
            restart_crashed_primary: false,
        })))
    }

    /// What is beside PGDATA (and in the socket directory), sorted.
    fn leftovers(&self) -> Vec<String> {
        let mut names: Vec<String> = [self.dir.0.join("data"), self.socket_dir()]
            .iter()
            .flat_map(|dir| std::fs::read_dir(dir).expect("list").flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pgdata") || n.starts_with("pgop-upgrade"))
            .collect();
        names.sort();
        names
    }

    async fn upgrade(&self, mode: UpgradeMode) -> Result<Outcome, upgrade::Error> {
        upgrade::upgrade(
            &fifteen(),
            &eighteen(),
            run_as(),
            &self.pgdata(),
            mode,
            &self.socket_dir(),
        )
        .await
    }
}

/// A manager whose server is killed when the test ends, even by a panic.
struct Server(Arc<Instance>);

impl std::ops::Deref for Server {
    type Target = Instance;
    fn deref(&self) -> &Instance {
        &self.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = self.0.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// A cluster as pgop's bootstrap makes it on PostgreSQL 15 (initdb with data checksums,
/// the application database and roles), with tables, an index, a sequence, a role and a
/// contrib extension in the application database; left running.
async fn fifteen_with_data(site: &Site) -> Server {
    let server = site.server(fifteen());
    // A preloaded library: pg_upgrade's new server gets it too.
    server.seed_parameters(&common::params(&[(
        "shared_preload_libraries",
        "pg_stat_statements",
    )]));
    server.bootstrap_primary().await.expect("bootstrap on 15");
    let app = server.endpoint().connect_to("app").await.expect("connect");
    let preloaded: String = app
        .query_one("SHOW shared_preload_libraries", &[])
        .await
        .expect("SHOW")
        .get(0);
    assert_eq!(preloaded, "pg_stat_statements");
    app.batch_execute(
        "CREATE ROLE reporter LOGIN PASSWORD 'reporter-secret';
         CREATE EXTENSION pg_stat_statements;
         CREATE SEQUENCE item_ids START 100;
         CREATE TABLE items (
             id bigint PRIMARY KEY DEFAULT nextval('item_ids'),
             name text NOT NULL,
             price numeric(10, 2),
             tags text[],
             created timestamptz DEFAULT '2020-01-01 00:00:00+00');
         INSERT INTO items (name, price, tags)
             SELECT 'item ' || g, g * 1.5, ARRAY['t' || (g % 7), 'u' || (g % 3)]
             FROM generate_series(1, 5000) g;
         CREATE INDEX items_name ON items (name);
         CREATE TABLE notes (id serial PRIMARY KEY, body jsonb);
         INSERT INTO notes (body) SELECT jsonb_build_object('n', g, 's', repeat('x', g % 50))
             FROM generate_series(1, 300) g;
         GRANT SELECT ON items TO reporter;",
    )
    .await
    .expect("fill the application database");
    server
}

/// What the application database holds, compared before and after.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    items: (i64, String),
    notes: (i64, String),
    sequence: i64,
    reporter_reads_items: bool,
    extension: Option<String>,
    by_index: i64,
}

async fn snapshot(server: &Instance) -> Snapshot {
    let app = server.endpoint().connect_to("app").await.expect("connect");
    let one = |sql: &'static str| {
        let app = &app;
        async move { app.query_one(sql, &[]).await.expect(sql) }
    };
    let items = one(
        "SELECT count(*), md5(string_agg(id || ':' || name || ':' || price || ':' ||
                array_to_string(tags, ',') || ':' || created, '|' ORDER BY id)) FROM items",
    )
    .await;
    let notes = one(
        "SELECT count(*), md5(string_agg(id || ':' || body::text, '|' ORDER BY id)) FROM notes",
    )
    .await;
    let sequence = one("SELECT last_value FROM item_ids").await;
    let reporter =
        one("SELECT has_table_privilege('reporter', 'items', 'SELECT') FROM pg_roles WHERE rolname = 'reporter'")
            .await;
    let extension = app
        .query_opt(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_stat_statements'",
            &[],
        )
        .await
        .expect("extension")
        .map(|r| r.get::<_, String>(0));
    app.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await
        .expect("SET");
    let by_index = one("SELECT count(*) FROM items WHERE name = 'item 4242'").await;
    Snapshot {
        items: (items.get(0), items.get(1)),
        notes: (notes.get(0), notes.get(1)),
        sequence: sequence.get(0),
        reporter_reads_items: reporter.get(0),
        extension,
        by_index: by_index.get(0),
    }
}

/// pg_controldata's `field` of `pgdata`.
async fn controldata(binaries: &Binaries, pgdata: &Path, field: &str) -> String {
    let mut cmd = pgop_instance::pg::binaries::command(binaries, "pg_controldata", run_as());
    let out = cmd
        .arg("-D")
        .arg(pgdata)
        .output()
        .await
        .expect("pg_controldata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            Some(
                l.split_once(':')
                    .filter(|(k, _)| k.trim() == field)?
                    .1
                    .trim()
                    .to_string(),
            )
        })
        .unwrap_or_else(|| panic!("no {field:?} in pg_controldata's output"))
}

/// The last two parts of a WAL file name (its position without the timeline).
fn position(walfile: &str) -> &str {
    &walfile[8..]
}

async fn upgrade_keeps_the_data(mode: UpgradeMode) -> TestResult {
    let site = Site::new(&format!("upgrade-{mode}"));
    let old = fifteen_with_data(&site).await;
    let before = snapshot(&old).await;
    assert_eq!(before.items.0, 5000);
    assert_eq!(before.by_index, 1);
    old.stop().await?;
    drop(old);
    let pgdata = site.pgdata();
    let old_timeline: u32 = controldata(&fifteen(), &pgdata, "Latest checkpoint's TimeLineID")
        .await
        .parse()?;
    let old_redo = controldata(&fifteen(), &pgdata, "Latest checkpoint's REDO WAL file").await;
    assert_eq!(
        site.server(eighteen()).data_state(),
        DataState::OlderMajor(15),
        "18's manager does not take 15's data for its own"
    );

    let started = Instant::now();
    let outcome = site.upgrade(mode).await?;
    let took = started.elapsed();
    let Outcome::Upgraded(upgraded) = outcome else {
        panic!("not upgraded: {outcome:?}");
    };
    assert_eq!((upgraded.from, upgraded.to, upgraded.mode), (15, 18, mode));
    assert_eq!(upgraded.timeline, old_timeline + 1);
    assert!(!upgraded.resumed);
    eprintln!("pg_upgrade --{mode}: {took:?}");
    assert_eq!(
        std::fs::read_to_string(pgdata.join("PG_VERSION"))?.trim(),
        "18"
    );
    assert_eq!(site.leftovers(), ["pgdata"], "nothing left beside PGDATA");

    // The manager on 18 renders its configuration and starts the upgraded data.
    let new = site.server(eighteen());
    assert_eq!(new.data_state(), DataState::Ready);
    new.start_as(Mode::Primary).await?;
    assert_eq!(snapshot(&new).await, before);
    let client = new.endpoint().connect().await?;
    let row = client
        .query_one(
            "SELECT timeline_id, redo_wal_file, current_setting('data_checksums'),
                    current_setting('server_version_num')::int
             FROM pg_control_checkpoint()",
            &[],
        )
        .await?;
    let (timeline, redo): (i32, String) = (row.get(0), row.get(1));
    assert_eq!(u32::try_from(timeline)?, old_timeline + 1);
    assert!(
        position(&redo) > position(&old_redo),
        "the new cluster's WAL ({redo}) goes on after the old one's ({old_redo})"
    );
    assert_eq!(
        row.get::<_, String>(2),
        "on",
        "data checksums as the old cluster's"
    );
    assert!(row.get::<_, i32>(3) >= 180000);
    // New WAL is written on the new timeline, whose history file is there to archive.
    let walfile: String = client
        .query_one("SELECT pg_walfile_name(pg_current_wal_lsn())", &[])
        .await?
        .get(0);
    assert!(
        walfile.starts_with(&format!("{:08X}", old_timeline + 1)),
        "{walfile}"
    );
    let history = format!("{:08X}.history", old_timeline + 1);
    assert!(pgdata.join("pg_wal").join(&history).is_file());
    assert!(
        pgdata
            .join("pg_wal/archive_status")
            .join(format!("{history}.ready"))
            .is_file()
    );
    let app = new.endpoint().connect_to("app").await?;
    app.batch_execute("INSERT INTO items (name) VALUES ('after the upgrade')")
        .await?;
    let next: i64 = app
        .query_one("SELECT id FROM items WHERE name = 'after the upgrade'", &[])
        .await?
        .get(0);
    assert_eq!(next, before.sequence + 1, "the sequence goes on");
    // Open sessions would hold the smart shutdown of stop() until its timeout.
    drop((app, client));
    if mode == UpgradeMode::Link {
        standby_reclones(&new).await?;
    }
    new.stop().await?;

    // Run again (the manager restarted): nothing to do.
    assert_eq!(
        site.upgrade(mode).await?,
        Outcome::AlreadyDone { major: 18 }
    );
    Ok(())
}

/// A standby whose volume still holds 15's data clones the upgraded primary afresh and
/// streams from it (on the new timeline, whose history file it fetches).
async fn standby_reclones(primary: &Instance) -> TestResult {
    let site = Site::new("upgrade-standby");
    let old = site.named("db-2", fifteen());
    old.bootstrap_primary().await?;
    old.stop().await?;
    drop(old);
    let standby = site.named("db-2", eighteen());
    assert_eq!(standby.data_state(), DataState::OlderMajor(15));
    primary.ensure_slots(&["db-2".to_string()]).await?;
    standby
        .bootstrap_standby(&primary.as_upstream("127.0.0.1"))
        .await?;
    primary
        .endpoint()
        .connect_to("app")
        .await?
        .batch_execute("INSERT INTO notes (body) VALUES ('{\"streamed\": true}')")
        .await?;
    let app = standby.endpoint().connect_to("app").await?;
    common::eventually(
        "the row on the standby",
        Duration::from_secs(30),
        || async {
            let row = app
                .query_one("SELECT count(*) FROM notes WHERE body ? 'streamed'", &[])
                .await
                .ok()?;
            (row.get::<_, i64>(0) == 1).then_some(())
        },
    )
    .await;
    drop(app);
    let status = standby.status().await;
    assert!(status.streaming, "{status:?}");
    assert_eq!(status.timeline, primary.status().await.timeline);
    standby.stop().await?;
    Ok(())
}

#[tokio::test]
async fn an_upgrade_with_links_keeps_every_row_and_moves_to_the_next_timeline() -> TestResult {
    upgrade_keeps_the_data(UpgradeMode::Link).await
}

#[tokio::test]
async fn an_upgrade_by_copy_keeps_every_row_and_moves_to_the_next_timeline() -> TestResult {
    upgrade_keeps_the_data(UpgradeMode::Copy).await
}

#[tokio::test]
async fn a_refused_upgrade_says_why_and_leaves_the_old_cluster_as_it_was() -> TestResult {
    let site = Site::new("upgrade-refused");
    let old = fifteen_with_data(&site).await;
    let app = old.endpoint().connect_to("app").await?;
    app.batch_execute(
        "CREATE TABLE grants (a aclitem); INSERT INTO grants VALUES ('app=r/postgres')",
    )
    .await?;
    let before = snapshot(&old).await;
    drop(app);
    old.stop().await?;
    drop(old);

    let err = site
        .upgrade(UpgradeMode::Link)
        .await
        .expect_err("pg_upgrade from 15 refuses aclitem columns");
    let chain = pgop_instance::error_chain(&err);
    assert!(chain.contains("aclitem"), "{chain}");
    assert!(
        chain.contains("grants"),
        "the list of offending columns pg_upgrade wrote: {chain}"
    );
    assert_eq!(site.leftovers(), ["pgdata"], "the new cluster is gone");
    assert_eq!(
        std::fs::read_to_string(site.pgdata().join("PG_VERSION"))?.trim(),
        "15"
    );

    let again = site.server(fifteen());
    again.start_as(Mode::Primary).await?;
    assert_eq!(snapshot(&again).await, before);
    let grants: i64 = again
        .endpoint()
        .connect_to("app")
        .await?
        .query_one("SELECT count(*) FROM grants", &[])
        .await?
        .get(0);
    assert_eq!(grants, 1);
    again.stop().await?;
    Ok(())
}

#[tokio::test]
async fn interrupted_upgrades_are_rolled_back_or_finished() -> TestResult {
    let site = Site::new("upgrade-interrupted");
    let pgdata = site.pgdata();
    let old = fifteen_with_data(&site).await;
    let before = snapshot(&old).await;
    old.stop().await?;
    drop(old);
    let new_dir = upgrade::new_dir(&pgdata, 18);
    let global = pgdata.join("global");

    // Killed in pg_upgrade --link: a half-made new cluster, pg_control renamed.
    let killed_in_pg_upgrade = || -> std::io::Result<()> {
        common::make_dir(&new_dir.join("base"));
        std::fs::write(new_dir.join("PG_VERSION"), "18\n")?;
        std::fs::rename(global.join("pg_control"), global.join("pg_control.old"))
    };
    killed_in_pg_upgrade()?;
    assert!(upgrade::interrupted(&pgdata, 18));
    assert_eq!(site.server(fifteen()).data_state(), DataState::Incomplete);
    // Without an upgrade request: rolled back, 15's data starts again.
    assert_eq!(upgrade::recover(&pgdata, 18).await?, None);
    assert!(!upgrade::interrupted(&pgdata, 18));
    assert_eq!(site.leftovers(), ["pgdata"]);
    let back = site.server(fifteen());
    back.start_as(Mode::Primary).await?;
    assert_eq!(snapshot(&back).await, before);
    back.stop().await?;
    drop(back);

    // With the request: rolled back, then upgraded.
    killed_in_pg_upgrade()?;
    let Outcome::Upgraded(upgraded) = site.upgrade(UpgradeMode::Link).await? else {
        panic!("not upgraded");
    };
    assert!(!upgraded.resumed);
    assert_eq!(site.leftovers(), ["pgdata"]);

    // Killed during the swap, the done marker written: each state on disk is finished
    // without pg_upgrade (a 15 directory stands in for the old data).
    let old_dir = upgrade::old_dir(&pgdata, 15);
    let marker = upgrade::done_marker(&pgdata, 18);
    let fake_old = |at: &Path| -> std::io::Result<()> {
        common::make_dir(&at.join("global"));
        std::fs::write(at.join("PG_VERSION"), "15\n")
    };
    let write_marker = || {
        std::fs::write(
            &marker,
            format!("from=15\nmode=link\ntimeline={}\n", upgraded.timeline),
        )
    };
    // a) marker written, nothing renamed yet;
    std::fs::rename(&pgdata, &new_dir)?;
    fake_old(&pgdata)?;
    write_marker()?;
    // b) PGDATA moved aside, the new directory not yet in place;
    // c) the new directory in place, the old one not yet removed.
    let states: [&dyn Fn() -> std::io::Result<()>; 3] = [
        &|| Ok(()),
        &|| {
            std::fs::rename(&pgdata, &new_dir)?;
            fake_old(&old_dir)?;
            write_marker()
        },
        &|| {
            fake_old(&old_dir)?;
            write_marker()
        },
    ];
    for (n, state) in states.iter().enumerate() {
        state()?;
        assert!(upgrade::interrupted(&pgdata, 18), "state {n}");
        let outcome = if n % 2 == 0 {
            site.upgrade(UpgradeMode::Link).await?
        } else {
            upgrade::recover(&pgdata, 18)
                .await?
                .expect("the swap is finished")
        };
        let Outcome::Upgraded(resumed) = outcome else {
            panic!("state {n}: {outcome:?}");
        };
        assert!(resumed.resumed, "state {n}");
        assert_eq!(resumed.timeline, upgraded.timeline);
        assert_eq!(site.leftovers(), ["pgdata"], "state {n}");
        assert!(!upgrade::interrupted(&pgdata, 18));
    }
    let new = site.server(eighteen());
    new.start_as(Mode::Primary).await?;
    assert_eq!(snapshot(&new).await, before);
    new.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_crashed_old_cluster_is_recovered_then_upgraded() -> TestResult {
    let site = Site::new("upgrade-crashed");
    let old = fifteen_with_data(&site).await;
    // Committed just before the crash: only in the WAL.
    let app = old.endpoint().connect_to("app").await?;
    app.batch_execute(
        "CHECKPOINT; INSERT INTO notes (body) SELECT '{\"late\": true}' FROM generate_series(1, 25)",
    )
    .await?;
    let before = snapshot(&old).await;
    assert_eq!(before.notes.0, 325);
    let mut stop = pgop_instance::pg::binaries::command(&fifteen(), "pg_ctl", run_as());
    let out = stop
        .args(["stop", "-m", "immediate", "-D"])
        .arg(site.pgdata())
        .output()
        .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::eventually(
        "the postmaster to exit",
        Duration::from_secs(10),
        || async { old.pid().is_none().then_some(()) },
    )
    .await;
    drop(old);
    assert_eq!(
        controldata(&fifteen(), &site.pgdata(), "Database cluster state").await,
        "in production"
    );

    let Outcome::Upgraded(upgraded) = site.upgrade(UpgradeMode::Link).await? else {
        panic!("not upgraded");
    };
    assert_eq!(upgraded.timeline, 2);
    let new = site.server(eighteen());
    new.start_as(Mode::Primary).await?;
    assert_eq!(snapshot(&new).await, before);
    new.stop().await?;
    Ok(())
}
