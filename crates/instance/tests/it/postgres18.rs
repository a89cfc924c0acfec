//! The scenarios of `postgres/` on PostgreSQL 18 (`hack/install-postgres18.sh` builds it
//! into /var/cache/pgop/postgresql/18): the same modules compiled a second time, in this
//! module, whose path `common::major` reads. No environment variable, so nothing
//! process-wide decides which PostgreSQL a test gets. Keep the list in step with
//! `postgres/mod.rs`.

#[allow(clippy::duplicate_mod)]
#[path = "postgres/bootstrap.rs"]
mod bootstrap;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/common.rs"]
pub mod common;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/config.rs"]
mod config;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/durability.rs"]
mod durability;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/failover.rs"]
mod failover;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/metrics.rs"]
mod metrics;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/rejoin.rs"]
mod rejoin;
#[allow(clippy::duplicate_mod)]
#[path = "postgres/replication.rs"]
mod replication;

#[test]
fn this_module_runs_postgresql_18_and_every_scenario_module_of_postgres() {
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
        mods(include_str!("postgres/mod.rs")),
        "postgres18.rs lists the modules of postgres/mod.rs"
    );
}
