use crate::common::{Node, TestResult, eventually, free_port};
use pgop_instance::{DataState, PgRole, Rejoin, Upstream};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// When pg_rewind cannot work (here: the "new primary" is another cluster altogether), the
/// former primary is cloned afresh from the new one and streams from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_primary_that_cannot_rewind_is_recloned() -> TestResult {
    let old = Node::new("rj-1");
    let new = Node::new("rj-2");
    old.instance.bootstrap_primary().await?;
    new.instance.bootstrap_primary().await?;
    new.app()
        .await?
        .batch_execute("CREATE TABLE only_on_new (id int); INSERT INTO only_on_new VALUES (1)")
        .await?;
    new.instance.ensure_slots(&["rj-1".to_string()]).await?;

    let how = old.instance.demote(&new.upstream()).await?;
    assert_eq!(how, Rejoin::Recloned);
    eventually("the re-cloned standby streaming", WAIT, || async {
        let s = old.instance.status().await;
        (s.role == PgRole::Replica && s.streaming && old.count("only_on_new").await == Some(1))
            .then_some(())
    })
    .await;
    assert_eq!(
        old.instance.status().await.system_identifier,
        new.instance.status().await.system_identifier
    );
    Ok(())
}

/// A rejoin towards a primary that does not answer keeps the data: nothing is wiped for a
/// clone that could not happen, and the instance can still start on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_towards_an_unreachable_primary_keeps_the_data() -> TestResult {
    let node = Node::new("rj-3");
    node.instance.bootstrap_primary().await?;
    node.app()
        .await?
        .batch_execute("CREATE TABLE precious (id int); INSERT INTO precious VALUES (1)")
        .await?;
    let nowhere = Upstream {
        host: "127.0.0.1".into(),
        port: free_port(),
        ..node.upstream()
    };
    assert!(node.instance.demote(&nowhere).await.is_err());
    assert_eq!(node.instance.data_state(), DataState::Ready);
    node.instance.start_as(pgop_instance::Mode::Primary).await?;
    assert_eq!(node.count("precious").await, Some(1));
    Ok(())
}
