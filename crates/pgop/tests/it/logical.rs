//! Logical backups (`pgop_backup::logical`) against real PostgreSQL 15 and a real S3 server
//! (`s3s-fs` on loopback): pg_dump per database and the globals into the store, restore
//! into a second server, a corrupt dump, retention and delete, a failing pg_dump.
//!
//! A missing `s3s-fs` fails the tests with the command that installs it
//! (`hack/install-s3-server.sh`); `PGOP_S3_SERVER` names another binary.

// `common::pg` (PostgreSQL 15) here; `common::pg18` where logical18.rs compiles this again.
use super::pg::{Node, S3Server, TempDir, flip_byte, tools};
use pgop_backup::logical::{self, LogicalTarget};
use pgop_backup::{Source, Store, StoreConfig};
use std::time::Instant;

async fn on(node: &Node, db: &str) -> tokio_postgres::Client {
    node.instance
        .endpoint()
        .connect_to(db)
        .await
        .unwrap_or_else(|e| panic!("connect to {db}: {e}"))
}

async fn exec(node: &Node, db: &str, sql: &str) {
    on(node, db)
        .await
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

/// Each statement on its own (`CREATE DATABASE` cannot run in the implicit transaction of
/// several statements).
async fn exec_each(node: &Node, db: &str, statements: &[&str]) {
    for sql in statements {
        exec(node, db, sql).await;
    }
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Whether the role `reporter` can log in, and its password hash.
async fn reporter(node: &Node) -> (bool, Option<String>) {
    let row = on(node, "postgres")
        .await
        .query_one(
            "SELECT rolcanlogin, rolpassword FROM pg_authid WHERE rolname = 'reporter'",
            &[],
        )
        .await
        .expect("the role reporter");
    (row.get(0), row.get(1))
}

/// Row count and md5 of the whole table's rows, in key order.
async fn fingerprint(node: &Node, db: &str, table: &str) -> (i64, String) {
    let row = on(node, db)
        .await
        .query_one(
            &format!(
                "SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM {table} t"
            ),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("fingerprint of {table} in {db}: {e}"));
    (row.get(0), row.get(1))
}

fn target(node: &Node, dbname: &str) -> LogicalTarget {
    LogicalTarget {
        host: node.socket_dir.display().to_string(),
        port: node.port,
        user: "postgres".into(),
        password: None,
        dbname: dbname.into(),
        ssl_root_cert: None,
    }
}

struct Env {
    dir: TempDir,
    s3: S3Server,
    config: StoreConfig,
    store: Store,
    src: Node,
}

async fn env(name: &str) -> Env {
    let dir = TempDir::new(name);
    let s3 = S3Server::start(&dir.0);
    let config = s3.config(&format!("logical-{name}"));
    let store = Store::open(&config).expect("open the store");
    let src = Node::bootstrap(&dir.0, "src-1", None).await;
    Env {
        dir,
        s3,
        config,
        store,
        src,
    }
}

const SHOP: &str = "shop-eu";
const BAKERY: &str = "bäckerei";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn databases_and_roles_restore_into_a_fresh_server_with_identical_data() {
    let env = env("restore").await;
    let src = &env.src;
    let create_databases = [
        format!("CREATE DATABASE {} TEMPLATE template0", quote(SHOP)),
        format!(
            "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'",
            quote(BAKERY)
        ),
    ];
    exec_each(
        src,
        "postgres",
        &[
            "CREATE ROLE reporter LOGIN PASSWORD 'reporter-secret'",
            &create_databases[0],
            &create_databases[1],
        ],
    )
    .await;
    exec(
        src,
        SHOP,
        "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2));
         INSERT INTO items SELECT i, 'item ' || md5(i::text), i * 1.25 FROM generate_series(1, 30000) i;
         CREATE INDEX items_name ON items (name);
         ALTER TABLE items OWNER TO reporter;",
    )
    .await;
    exec(
        src,
        BAKERY,
        "CREATE TABLE orders (id bigserial PRIMARY KEY, customer text, at timestamptz, note text);
         INSERT INTO orders (customer, at, note)
           SELECT 'Kunde ' || (i % 97), '2025-01-01'::timestamptz + i * interval '1 minute', 'Brötchen ×' || i
           FROM generate_series(1, 20000) i;
         CREATE VIEW big_orders AS SELECT * FROM orders WHERE id > 19000;
         GRANT SELECT ON orders TO reporter;",
    )
    .await;
    // Poolers on both sides: pgop's look-up role and schema are pgop's own, neither dumped
    // with a database nor restored with the globals.
    src.instance
        .apply_pooler_auth(Some("source-look-up"))
        .await
        .expect("the source's pooler look-up");
    let shop_before = fingerprint(src, SHOP, "items").await;
    let bakery_before = fingerprint(src, BAKERY, "orders").await;
    assert_eq!(shop_before.0, 30000);
    assert_eq!(bakery_before.0, 20000);

    let started = Instant::now();
    let manifest = logical::take(&env.store, &tools(), &env.src.source(), "logical-restore")
        .await
        .expect("logical backup");
    let took = started.elapsed();
    eprintln!(
        "logical backup {}: {} bytes dumped, {} stored, in {took:?}",
        manifest.backup_id,
        manifest.size_bytes(),
        manifest.stored_bytes()
    );
    let names: Vec<&str> = manifest.databases.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec!["app", BAKERY, "postgres", SHOP]);
    assert_eq!(manifest.cluster, "logical-restore");
    assert!(manifest.server_version_num >= 150000);
    assert!(manifest.end_time() >= manifest.begin_time());
    let bakery = manifest.database(BAKERY).expect("bakery dump");
    assert_eq!(
        bakery.dump.object,
        format!("logical/{}/db/b_c3_a4ckerei.dump", manifest.backup_id)
    );
    for object in
        std::iter::once(&manifest.globals).chain(manifest.databases.iter().map(|d| &d.dump))
    {
        let footer = env
            .store
            .footer(&object.object)
            .await
            .expect("footer")
            .unwrap_or_else(|| panic!("{} is in the store", object.object));
        assert_eq!(footer.content_sha256, object.sha256);
        assert_eq!(footer.content_len, object.size_bytes);
        assert!(object.size_bytes > 0, "{object:?}");
    }
    // Compressed once (pg_dump -Z0, the store's gzip): the data compresses well.
    let shop = manifest.database(SHOP).expect("shop dump");
    assert!(
        shop.dump.stored_bytes * 2 < shop.dump.size_bytes,
        "{:?}",
        shop.dump
    );
    assert_eq!(
        logical::list(&env.store).await.expect("list"),
        vec![manifest.clone()]
    );
    assert_eq!(
        logical::get(&env.store, &manifest.backup_id)
            .await
            .expect("get"),
        Some(manifest.clone())
    );

    // A second, fresh server: the globals first, then each database into an empty one.
    let dst = Node::bootstrap(&env.dir.0, "dst-1", None).await;
    dst.instance
        .apply_pooler_auth(Some("target-look-up"))
        .await
        .expect("the target's pooler look-up");
    let look_up_verifier = async |node: &Node| -> Option<String> {
        on(node, "postgres")
            .await
            .query_one(
                "SELECT rolpassword FROM pg_authid WHERE rolname = 'pgop_pooler'",
                &[],
            )
            .await
            .expect("pgop_pooler")
            .get(0)
    };
    let target_verifier = look_up_verifier(&dst).await;
    let scratch = TempDir::new("restore-scratch");
    let globals = logical::restore_globals(
        &env.store,
        &tools(),
        &manifest.backup_id,
        &target(&dst, "postgres"),
        &scratch.0,
    )
    .await
    .expect("restore the globals");
    assert_eq!(globals.created_roles, vec!["reporter"]);
    assert_eq!(look_up_verifier(&dst).await, target_verifier);
    assert_ne!(look_up_verifier(src).await, target_verifier);
    assert!(
        globals.existing_roles.iter().any(|r| r == "postgres"),
        "{globals:?}"
    );
    let (can_login, dst_password) = reporter(&dst).await;
    assert!(can_login);
    assert!(dst_password.is_some());
    assert_eq!(
        dst_password,
        reporter(src).await.1,
        "the same password hash"
    );

    exec_each(
        &dst,
        "postgres",
        &[&create_databases[0], &create_databases[1]],
    )
    .await;
    // The target's databases have the look-up schema before the restore.
    dst.instance
        .apply_pooler_auth(Some("target-look-up"))
        .await
        .expect("the target's pooler look-up in the new databases");
    for (db, object) in [(SHOP, &shop.dump), (BAKERY, &bakery.dump)] {
        let bytes = logical::restore(
            &env.store,
            &tools(),
            &manifest.backup_id,
            db,
            &target(&dst, db),
            &scratch.0,
        )
        .await
        .unwrap_or_else(|e| panic!("restore {db}: {e}"));
        assert_eq!(bytes, object.size_bytes);
    }
    assert_eq!(fingerprint(&dst, SHOP, "items").await, shop_before);
    assert_eq!(fingerprint(&dst, BAKERY, "orders").await, bakery_before);
    let row = on(&dst, SHOP)
        .await
        .query_one(
            "SELECT tableowner::text, (SELECT count(*) FROM pg_indexes WHERE tablename = 'items')
             FROM pg_tables WHERE tablename = 'items'",
            &[],
        )
        .await
        .expect("items");
    assert_eq!(row.get::<_, String>(0), "reporter");
    assert_eq!(row.get::<_, i64>(1), 2, "primary key and items_name");
    let row = on(&dst, BAKERY)
        .await
        .query_one(
            "SELECT has_table_privilege('reporter', 'orders', 'SELECT'),
                    (SELECT count(*) FROM big_orders),
                    nextval('orders_id_seq')",
            &[],
        )
        .await
        .expect("orders");
    assert!(row.get::<_, bool>(0), "the grant came along");
    assert_eq!(row.get::<_, i64>(1), 1000);
    assert_eq!(row.get::<_, i64>(2), 20001, "the sequence came along");
    let left: Vec<_> = std::fs::read_dir(&scratch.0)
        .expect("scratch")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "temporary files left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupt_dump_fails_the_restore_naming_it_and_leaves_the_target_untouched() {
    let env = env("corrupt").await;
    exec(&env.src, "postgres", "CREATE DATABASE shop").await;
    exec(
        &env.src,
        "shop",
        "CREATE TABLE items AS SELECT i AS id, md5(i::text) AS v FROM generate_series(1, 20000) i",
    )
    .await;
    let manifest = logical::take(&env.store, &tools(), &env.src.source(), "c")
        .await
        .expect("logical backup");
    let dump = &manifest.database("shop").expect("shop").dump;
    flip_byte(&env.s3.object_file(&env.config, &dump.object), None);

    let dst = Node::bootstrap(&env.dir.0, "dst-1", None).await;
    exec(&dst, "postgres", "CREATE DATABASE shop TEMPLATE template0").await;
    let scratch = TempDir::new("corrupt-scratch");
    let err = logical::restore(
        &env.store,
        &tools(),
        &manifest.backup_id,
        "shop",
        &target(&dst, "shop"),
        &scratch.0,
    )
    .await
    .expect_err("a corrupt dump must not restore");
    let shown = err.to_string();
    assert!(
        shown.contains(&dump.object) && shown.contains("corrupt"),
        "{shown}"
    );
    let row = on(&dst, "shop")
        .await
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace",
            &[],
        )
        .await
        .expect("count relations");
    assert_eq!(row.get::<_, i64>(0), 0, "nothing was restored");
    assert_eq!(
        std::fs::read_dir(&scratch.0).expect("scratch").count(),
        0,
        "the temporary file is removed"
    );

    // A database the backup does not have, an id that is not one.
    let err = logical::restore(
        &env.store,
        &tools(),
        &manifest.backup_id,
        "nope",
        &target(&dst, "shop"),
        &scratch.0,
    )
    .await
    .expect_err("no such database");
    assert!(
        matches!(err, logical::Error::UnknownDatabase { .. }),
        "{err}"
    );
    let err = logical::get(&env.store, "../../wal")
        .await
        .expect_err("not an id");
    assert!(matches!(err, logical::Error::InvalidBackupId(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_removes_a_logical_backup_and_retention_keeps_the_newest() {
    let env = env("retention").await;
    let first = logical::take(&env.store, &tools(), &env.src.source(), "r")
        .await
        .expect("first logical backup");
    let second = logical::take(&env.store, &tools(), &env.src.source(), "r")
        .await
        .expect("second logical backup");
    assert!(first.backup_id < second.backup_id, "one id per backup");
    assert_eq!(
        logical::list(&env.store).await.expect("list"),
        vec![first.clone(), second.clone()]
    );
    // A leftover of a failed backup: objects without manifest.
    env.store
        .put(
            "logical/20200101T000000Z/globals.sql",
            b"-- partial".to_vec().into(),
            true,
        )
        .await
        .expect("a leftover");

    let now = jiff::Timestamp::now();
    let result = logical::apply_retention(&env.store, now, 1, false)
        .await
        .expect("retention today");
    assert!(result.deleted.is_empty(), "{result:?}");
    assert!(
        result.deleted_incomplete.is_empty(),
        "too young: {result:?}"
    );

    logical::delete(&env.store, &first.backup_id)
        .await
        .expect("delete");
    assert_eq!(
        logical::list(&env.store).await.expect("list"),
        vec![second.clone()]
    );
    let dir = format!("logical/{}/", first.backup_id);
    assert!(
        env.store.list(&dir).await.expect("list objects").is_empty(),
        "objects of the deleted backup remain"
    );
    logical::delete(&env.store, &first.backup_id)
        .await
        .expect("deleting again is fine");
    for object in std::iter::once(&second.globals).chain(second.databases.iter().map(|d| &d.dump)) {
        assert!(
            env.store
                .footer(&object.object)
                .await
                .expect("footer")
                .is_some(),
            "{} of the kept backup",
            object.object
        );
    }

    // Two days later: the newest stays however old; the leftover goes.
    let later = now + jiff::SignedDuration::from_hours(48);
    let result = logical::apply_retention(&env.store, later, 1, false)
        .await
        .expect("retention later");
    assert!(result.deleted.is_empty(), "{result:?}");
    assert_eq!(result.kept, vec![second.backup_id.clone()]);
    assert_eq!(result.deleted_incomplete, vec!["20200101T000000Z"]);
    assert!(
        logical::incomplete(&env.store)
            .await
            .expect("incomplete")
            .is_empty()
    );
    assert_eq!(logical::list(&env.store).await.expect("list"), vec![second]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_pg_dump_fails_the_backup_and_leaves_nothing_listed() {
    let env = env("failing").await;
    exec_each(
        &env.src,
        "postgres",
        &[
            "CREATE DATABASE \"aaa-ok\"",
            "CREATE DATABASE \"zz-broken\"",
            "ALTER DATABASE \"zz-broken\" SET session_preload_libraries = 'pgop_no_such_library'",
        ],
    )
    .await;
    let err = logical::take(&env.store, &tools(), &env.src.source(), "f")
        .await
        .expect_err("pg_dump of zz-broken fails");
    match &err {
        logical::Error::Dump {
            database, stderr, ..
        } => {
            assert_eq!(database, "zz-broken");
            assert!(stderr.contains("pgop_no_such_library"), "{stderr}");
        }
        other => panic!("not a pg_dump error: {other}"),
    }
    assert!(logical::list(&env.store).await.expect("list").is_empty());
    assert!(
        env.store
            .list("logical/")
            .await
            .expect("objects")
            .is_empty(),
        "the dumps taken before the failure are removed"
    );

    // A server that is not there.
    let nowhere = Source {
        socket_dir: env.dir.0.join("no-server-here"),
        port: env.src.port,
    };
    let err = logical::take(&env.store, &tools(), &nowhere, "f")
        .await
        .expect_err("no server");
    assert!(matches!(err, logical::Error::Connect(_)), "{err}");
    assert!(logical::list(&env.store).await.expect("list").is_empty());

    // The same server without the broken setting backs up.
    exec(
        &env.src,
        "postgres",
        "ALTER DATABASE \"zz-broken\" RESET session_preload_libraries",
    )
    .await;
    let manifest = logical::take(&env.store, &tools(), &env.src.source(), "f")
        .await
        .expect("logical backup");
    assert!(manifest.database("zz-broken").is_some());
    assert_eq!(logical::list(&env.store).await.expect("list").len(), 1);
}

/// This target's PostgreSQL: 15, or 18 when compiled as the `*18` twin.
#[test]
fn the_binaries_are_of_the_major_this_module_names() {
    super::pg::check_binaries_of_this_module();
}
