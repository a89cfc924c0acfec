//! The manager's major upgrade before its first pass ([`crate::upgrade`]): the one asked
//! for on the primary's Pod, or what an interrupted one left.

use super::Settings;
use crate::bootstrap::{self, DataState};
use crate::pg::Binaries;
use crate::upgrade::{self, UpgradeRequest};

/// Before the first pass: the in-place major upgrade [`Settings::upgrade`] asks for, when
/// the data directory holds that major (complete, no bootstrap under way), or else what an
/// interrupted upgrade to the binaries' major left (finished when pg_upgrade had
/// completed, rolled back otherwise). Logs what it did.
pub(super) async fn upgrade_data(settings: &Settings) -> Result<(), upgrade::Error> {
    let pgdata = &settings.pgdata;
    let to = settings.binaries.major().map_err(upgrade::Error::Version)?;
    let interrupted = upgrade::interrupted(pgdata, to);
    let outcome = match settings.upgrade {
        Some(UpgradeRequest { from, mode })
            if interrupted
                || bootstrap::inspect(pgdata, Some(to)) == DataState::OlderMajor(from) =>
        {
            let old =
                Binaries::for_major(from, None).map_err(|source| upgrade::Error::FindBinaries {
                    major: from,
                    source,
                })?;
            tracing::info!(from, to, %mode, pgdata = %pgdata.display(), "upgrading the data directory in place with pg_upgrade");
            Some(
                upgrade::upgrade(
                    &old,
                    &settings.binaries,
                    settings.run_as,
                    pgdata,
                    mode,
                    &settings.socket_dir,
                )
                .await?,
            )
        }
        _ if interrupted => {
            tracing::info!(to, pgdata = %pgdata.display(), "an upgrade to PostgreSQL {to} was interrupted: finishing or rolling it back");
            upgrade::recover(pgdata, to).await?
        }
        Some(UpgradeRequest { from, .. }) => {
            match bootstrap::data_major(pgdata) {
                Some(found) if found == to => {
                    tracing::info!(
                        from,
                        to,
                        "the data directory already holds PostgreSQL {to}: nothing to upgrade"
                    )
                }
                found => {
                    tracing::info!(
                        from,
                        to,
                        ?found,
                        "an upgrade from PostgreSQL {from} was requested, but the data directory holds no complete cluster of it: nothing to upgrade"
                    )
                }
            }
            None
        }
        None => None,
    };
    match outcome {
        Some(upgrade::Outcome::Upgraded(u)) => tracing::info!(
            from = u.from,
            to = u.to,
            mode = %u.mode,
            timeline = u.timeline,
            duration = ?u.duration,
            resumed = u.resumed,
            "upgraded the data directory to PostgreSQL {}", u.to
        ),
        Some(upgrade::Outcome::AlreadyDone { major }) => {
            tracing::info!(
                major,
                "the data directory already holds PostgreSQL {major}: nothing to upgrade"
            )
        }
        None => {}
    }
    Ok(())
}
