//! pgop's PostgreSQL 18 build (`hack/install-postgres18.sh`, also the image's 18) and its one
//! patch, `hack/postgres18-accept-pg_attver.patch`: the column option `pg_attver`, which
//! PostgreSQL 15.20 (the pgop image's 15, from bookworm-security) and 18.7 stamp on every
//! column and write into their dumps, is accepted and ignored; every other option is
//! handled as before. The upgrade it unblocks, 15.20 to 18 with pg_upgrade, runs on real
//! nodes in `e2e_real_postgres18.rs`.

use crate::common::pg18 as pg;
use pg::{Node, TempDir};

/// The statements Debian's 15.20 pg_dump writes for a table `t (a bigint, b text)` (taken
/// from its output, with the values that server stamped), after its `CREATE TABLE`.
const DUMPED_BY_15_20: &str = "
    CREATE TABLE public.t (a bigint, b text);
    ALTER TABLE ONLY public.t ALTER COLUMN a SET (pg_attver=22224920);
    ALTER TABLE ONLY public.t ALTER COLUMN b SET (pg_attver=22224920);
";

async fn attoptions(node: &Node, column: &str) -> Option<Vec<String>> {
    node.sql()
        .await
        .query_one(
            "SELECT attoptions FROM pg_attribute WHERE attrelid = 'public.t'::regclass AND attname = $1",
            &[&column],
        )
        .await
        .unwrap_or_else(|e| panic!("attoptions of t.{column}: {e}"))
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_of_postgres_15_20_restores_and_pg_attver_is_ignored() {
    let dir = TempDir::new("pg-attver");
    let node = Node::bootstrap(&dir.0, "build-1", None).await;
    node.exec(DUMPED_BY_15_20).await;
    assert_eq!(attoptions(&node, "a").await, None);
    assert_eq!(attoptions(&node, "b").await, None);

    // Beside another option, only pg_attver goes; RESET of it is accepted too.
    node.exec("ALTER TABLE t ALTER COLUMN b SET (pg_attver=1, n_distinct=-1)")
        .await;
    assert_eq!(
        attoptions(&node, "b").await,
        Some(vec!["n_distinct=-1".to_string()])
    );
    node.exec("ALTER TABLE t ALTER COLUMN b RESET (pg_attver)")
        .await;
    assert_eq!(
        attoptions(&node, "b").await,
        Some(vec!["n_distinct=-1".to_string()])
    );

    // Unknown options are refused as before, and a namespaced pg_attver is not the stamp.
    for (bad, refusal) in [
        (
            "ALTER TABLE t ALTER COLUMN a SET (pg_attver_x=1)",
            "unrecognized parameter \"pg_attver_x\"",
        ),
        (
            "ALTER TABLE t ALTER COLUMN a SET (toast.pg_attver=1)",
            "unrecognized parameter namespace \"toast\"",
        ),
        (
            "ALTER TABLE t ALTER COLUMN a SET (n_distinct=-2)",
            "out of bounds for option \"n_distinct\"",
        ),
    ] {
        let error = node.sql().await.batch_execute(bad).await.expect_err(bad);
        let message = error.as_db_error().map(|e| e.message().to_string());
        assert!(
            message.as_deref().is_some_and(|m| m.contains(refusal)),
            "{bad}: expected the server to refuse it with {refusal:?}, got {error:?}"
        );
    }
    assert_eq!(attoptions(&node, "a").await, None);
}

/// This module's PostgreSQL is 18 (it uses `common::pg18`).
#[test]
fn the_binaries_are_of_the_major_this_module_names() {
    pg::check_binaries_of_this_module();
}
