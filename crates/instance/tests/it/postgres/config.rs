use super::common::{Http, Node, TestResult, params, show};
use pgop_api::constants::{PATH_HEALTHZ, PATH_READYZ};

/// A parameter that needs only a reload is live at once, on the same postmaster; one that
/// needs a restart is reported as pending on `/pg/status` until the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_at_once_and_restart_parameters_show_pending_restart() -> TestResult {
    let node = Node::new("cfg-1");
    node.instance.bootstrap_primary().await?;
    let http = Http::serve(&node).await;
    assert_eq!(http.get(PATH_HEALTHZ).await.0, 200);
    assert_eq!(http.get(PATH_READYZ).await.0, 200);
    let pid = node.instance.pid();

    let report = node
        .instance
        .apply_config(&params(&[("work_mem", "8MB")]), &[])
        .await?;
    assert!(report.invalid.is_empty(), "{report:?}");
    assert!(report.pending_restart.is_empty(), "{report:?}");
    assert_eq!(show(&node, "work_mem").await, "8MB");
    assert_eq!(
        node.instance.pid(),
        pid,
        "a reload must not restart PostgreSQL"
    );

    let wanted = params(&[("work_mem", "8MB"), ("max_connections", "42")]);
    let report = node.instance.apply_config(&wanted, &[]).await?;
    assert_eq!(report.pending_restart, ["max_connections"]);
    let status = http.status().await;
    assert!(status.pending_restart);
    assert_eq!(status.pending_restart_parameters, ["max_connections"]);
    assert_ne!(show(&node, "max_connections").await, "42");

    node.instance.restart().await?;
    assert_eq!(show(&node, "max_connections").await, "42");
    assert!(!http.status().await.pending_restart);
    Ok(())
}

/// Refused parameters (unknown, malformed, out of range, wrong enum) and a malformed pg_hba
/// rule are reported, never written: PostgreSQL keeps running on the last good values and
/// still starts from its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_parameters_are_reported_and_the_last_good_config_kept() -> TestResult {
    let node = Node::new("cfg-2");
    node.instance.bootstrap_primary().await?;
    let http = Http::serve(&node).await;
    node.instance
        .apply_config(&params(&[("work_mem", "8MB")]), &[])
        .await?;
    let pid = node.instance.pid();

    let wanted = params(&[
        ("work_mem", "lots"),
        ("no_such_parameter", "1"),
        ("shared_buffers", "1kB"),
        ("synchronous_commit", "sometimes"),
        ("timezone", "Mars/Olympus_Mons"),
        ("port", "1"),
        ("statement_timeout", "5s"),
    ]);
    let hba = vec!["host all all all no-such-method".to_string()];
    let report = node.instance.apply_config(&wanted, &hba).await?;
    let mut refused: Vec<&str> = report.invalid.iter().map(|p| p.name.as_str()).collect();
    refused.sort();
    assert_eq!(
        refused,
        [
            "no_such_parameter",
            "pgHba",
            "port",
            "shared_buffers",
            "synchronous_commit",
            "timezone",
            "work_mem"
        ],
        "{report:?}"
    );
    assert_eq!(http.status().await.invalid_parameters.len(), 7);
    assert_eq!(node.instance.pid(), pid, "PostgreSQL keeps running");
    assert_eq!(
        show(&node, "work_mem").await,
        "8MB",
        "the last good value stays"
    );
    assert_eq!(
        show(&node, "statement_timeout").await,
        "5s",
        "valid ones still apply"
    );

    let pgdata = node.instance.options().layout.pgdata.clone();
    let conf = std::fs::read_to_string(pgdata.join("postgresql.conf"))?;
    assert!(
        !conf.contains("'lots'") && !conf.contains("no_such_parameter") && !conf.contains("Mars")
    );
    let hba_file = std::fs::read_to_string(pgdata.join("pg_hba.conf"))?;
    assert!(!hba_file.contains("no-such-method"));
    // The files on disk still start a server.
    node.instance.restart().await?;
    assert_eq!(show(&node, "work_mem").await, "8MB");
    Ok(())
}

/// The spec's parameters are in effect from an instance's first start, those that take
/// effect only at start included: no restart right after a bootstrap, and a standby of a
/// primary with a raised `max_connections` starts at all (a hot standby refuses to run
/// with fewer connections than its primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_start_carries_the_specs_parameters() -> TestResult {
    let wanted = params(&[("max_connections", "142"), ("shared_buffers", "48MB")]);
    let primary = Node::new("seed-1");
    let standby = Node::new("seed-2");
    primary.instance.seed_parameters(&wanted);
    primary.instance.bootstrap_primary().await?;
    assert_eq!(show(&primary, "max_connections").await, "142");
    assert_eq!(show(&primary, "shared_buffers").await, "48MB");
    let report = primary.instance.apply_config(&wanted, &[]).await?;
    assert!(
        report.invalid.is_empty() && report.pending_restart.is_empty(),
        "nothing to restart for: {report:?}"
    );

    primary
        .instance
        .ensure_slots(&["seed-2".to_string()])
        .await?;
    standby.instance.seed_parameters(&wanted);
    standby
        .instance
        .bootstrap_standby(&primary.upstream())
        .await?;
    assert_eq!(show(&standby, "max_connections").await, "142");
    let report = standby.instance.apply_config(&wanted, &[]).await?;
    assert!(report.pending_restart.is_empty(), "{report:?}");

    // Lowering a value a hot standby needs at least at the primary's is reported apart
    // (the primary must restart first); raising it is not.
    let lower = params(&[("max_connections", "120"), ("shared_buffers", "48MB")]);
    primary.instance.apply_config(&lower, &[]).await?;
    let status = primary.instance.status().await;
    assert_eq!(status.pending_restart_parameters, ["max_connections"]);
    assert_eq!(status.pending_restart_decreases, ["max_connections"]);
    let higher = params(&[("max_connections", "160"), ("shared_buffers", "48MB")]);
    primary.instance.apply_config(&higher, &[]).await?;
    let status = primary.instance.status().await;
    assert_eq!(status.pending_restart_parameters, ["max_connections"]);
    assert!(status.pending_restart_decreases.is_empty(), "{status:?}");
    Ok(())
}

/// Seeded parameters PostgreSQL refuses at start do not keep it down: it starts without
/// them, and the check that follows names the bad one and leaves the good one pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_with_a_bad_parameter_falls_back_to_none() -> TestResult {
    let wanted = params(&[("max_connections", "142"), ("shared_buffers", "lots")]);
    let node = Node::new("seed-3");
    node.instance.seed_parameters(&wanted);
    node.instance.bootstrap_primary().await?;
    assert_ne!(show(&node, "max_connections").await, "142");
    let report = node.instance.apply_config(&wanted, &[]).await?;
    let refused: Vec<&str> = report.invalid.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(refused, ["shared_buffers"], "{report:?}");
    assert_eq!(report.pending_restart, ["max_connections"]);
    // Checked once: a later start no longer takes the spec's values unchecked.
    node.instance.seed_parameters(&wanted);
    node.instance.restart().await?;
    assert_eq!(show(&node, "max_connections").await, "142");
    Ok(())
}

/// Hostile names, values and pg_hba rules that somehow reach the manager (an old CRD, a
/// disabled schema check) are reported and never written: not when seeded for the first
/// start, not when applied to a running server. PostgreSQL keeps reloading and starting
/// from its files, and the superuser cannot log in over the network whatever the rules say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_parameters_that_reach_the_manager_never_reach_postgresql_conf() -> TestResult {
    let hostile = [
        (
            "pgop.x = 'y'\narchive_cleanup_command",
            "touch /tmp/pgop-pwned",
        ),
        ("include_if_exists", "/etc/passwd"),
        ("ssl_passphrase_command", "id"),
        ("application_name", "x\nport = '5433'"),
        ("search_path", "x\r\nlisten_addresses = '*'"),
        ("work_mem = '1MB' #", "1"),
    ];
    let mut wanted = params(&hostile);
    wanted.insert("statement_timeout".into(), "7s".into());
    let hba = vec![
        "host all all 0.0.0.0/0 trust".to_string(),
        "host all all all md5\nhost all all all trust".to_string(),
        "host @/etc/passwd all all md5".to_string(),
    ];

    let node = Node::new("cfg-hostile");
    node.instance.seed_parameters(&wanted);
    node.instance.bootstrap_primary().await?;
    let pgdata = node.instance.options().layout.pgdata.clone();
    let unwritten = |conf: &str| {
        !conf.contains("pgop-pwned")
            && !conf.contains("5433")
            && !conf.contains("'*'")
            && !conf.contains("include_if_exists")
            && !conf.contains("ssl_passphrase_command")
    };
    let conf = std::fs::read_to_string(pgdata.join("postgresql.conf"))?;
    assert!(unwritten(&conf), "seeded for the first start: {conf}");

    let report = node.instance.apply_config(&wanted, &hba).await?;
    let mut refused: Vec<&str> = report.invalid.iter().map(|p| p.name.as_str()).collect();
    refused.sort();
    let mut expected: Vec<&str> = hostile.iter().map(|(k, _)| *k).collect();
    expected.extend(["pgHba", "pgHba"]);
    expected.sort();
    assert_eq!(refused, expected, "{report:?}");
    assert_eq!(
        show(&node, "statement_timeout").await,
        "7s",
        "valid ones apply"
    );
    assert_eq!(
        show(&node, "port").await,
        node.instance.options().layout.port.to_string()
    );
    let conf = std::fs::read_to_string(pgdata.join("postgresql.conf"))?;
    assert!(unwritten(&conf), "applied: {conf}");
    let hba_file = std::fs::read_to_string(pgdata.join("pg_hba.conf"))?;
    assert!(!hba_file.contains('@'), "{hba_file}");
    assert!(
        hba_file.contains("host all all 0.0.0.0/0 trust\n"),
        "{hba_file}"
    );

    // `trust` for everyone is the user's rule, but the superuser stays socket-only.
    let layout = &node.instance.options().layout;
    let over_tcp = |user: &'static str| {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&layout.listen_addresses)
            .port(layout.port)
            .user(user)
            .dbname("postgres")
            .connect_timeout(std::time::Duration::from_secs(10));
        async move { config.connect(tokio_postgres::NoTls).await.map(drop) }
    };
    let refused = over_tcp("postgres")
        .await
        .expect_err("no superuser over TCP");
    let message = refused
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_else(|| refused.to_string());
    assert!(message.contains("rejects connection"), "{message}");

    // The files still start a server, and dropping the hostile entries clears the report.
    node.instance.restart().await?;
    let report = node
        .instance
        .apply_config(&params(&[("statement_timeout", "7s")]), &[])
        .await?;
    assert!(report.invalid.is_empty(), "{report:?}");
    assert!(!std::path::Path::new("/tmp/pgop-pwned").exists());
    Ok(())
}
