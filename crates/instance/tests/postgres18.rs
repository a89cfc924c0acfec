//! The scenarios of `tests/postgres/` on PostgreSQL 18 (`hack/install-postgres18.sh`
//! builds it into /var/cache/pgop/postgresql/18): the same modules compiled a second time,
//! as this target, whose name `common::major` reads. No environment variable, so nothing
//! process-wide decides which PostgreSQL a test gets. Keep the list in step with
//! `tests/postgres/main.rs`.

#[path = "postgres/bootstrap.rs"]
mod bootstrap;
#[path = "postgres/common.rs"]
mod common;
#[path = "postgres/config.rs"]
mod config;
#[path = "postgres/durability.rs"]
mod durability;
#[path = "postgres/failover.rs"]
mod failover;
#[path = "postgres/metrics.rs"]
mod metrics;
#[path = "postgres/rejoin.rs"]
mod rejoin;
#[path = "postgres/replication.rs"]
mod replication;

#[test]
fn this_target_runs_postgresql_18_and_every_scenario_module_of_the_15_target() {
    assert_eq!(common::major(), 18);
    assert_eq!(common::binaries().major().ok(), Some(18));
    let mods = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        mods(include_str!("postgres18.rs")),
        mods(include_str!("postgres/main.rs")),
        "tests/postgres18.rs lists the modules of tests/postgres/main.rs"
    );
}
