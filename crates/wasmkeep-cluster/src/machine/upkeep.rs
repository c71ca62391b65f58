//! The alarm index kept in line with an owner's uploads and deliveries
//! (ADR 0009), as step machines: which entries are listed before an upload,
//! when the actor is given up instead of uploading, what is removed once the
//! upload landed (R1, R2, R4), and how a delivery that finds an actor's
//! entries stale removes them (R2, R3).
//!
//! What the entries *are* is decided by the pure rules of
//! [`crate::alarm_index`] (`plan_event_in_layouts`, `plan_first_upload`,
//! `stale_entries_to_delete`); the runtime (its `index.rs` and
//! `replication.rs`) and the simulator's node drive these machines, so the
//! seeds prove the order the server keeps.
//!
//! - [`IndexUpkeep`] is an actor's ledger: each commit's planned index
//!   writes ([`Planned`]), kept until an upload carries the commit.
//! - [`UploadRound`] is one upload: list every entry the carried commits
//!   name (create-only PUTs), then upload, then remove what they replaced.
//!   A listing that fails gives the actor up with nothing uploaded: no
//!   other node could find an alarm the bucket's state names but the index
//!   lacks.
//! - [`StaleCleanup`] is one delivery's removal of an actor's stale entries
//!   at one time: one listing page, then a bounded number of deletes.
//!
//! ```
//! use wasmkeep_cluster::machine::{IndexUpkeep, Listing, Planned, UpkeepEffect};
//!
//! let mut upkeep = IndexUpkeep::default();
//! upkeep.plan(1, Planned {
//!     list_before: Some(Listing { key: "idx/new".into(), create_only: true }),
//!     list_after: None,
//!     remove_after: Some("idx/old".into()),
//! });
//! let mut round = upkeep.start_upload(1);
//! let mut log = Vec::new();
//! while let Some(effect) = round.poll_effect() {
//!     match effect {
//!         UpkeepEffect::List(l) => {
//!             log.push(format!("put {}", l.key));
//!             round.on_listed(wasmkeep_cluster::machine::BucketResult::Done);
//!         }
//!         UpkeepEffect::Upload => {
//!             log.push("upload".to_string());
//!             round.on_uploaded(true);
//!         }
//!         UpkeepEffect::Landed { remove, .. } => log.push(format!("delete {}", remove.join(","))),
//!         UpkeepEffect::GiveUp(_) => log.push("give up".to_string()),
//!     }
//! }
//! assert_eq!(log, ["put idx/new", "upload", "delete idx/old"]);
//! ```

use std::collections::VecDeque;

use crate::alarm_index::{Address, Entry, IndexKey, stale_entries_to_delete, tagged_folder};
use crate::rules::Rules;

use super::{BucketOp, BucketResult};

/// Keys one listing of an actor's entries at one time reads when a delivery
/// removes stale ones; entries beyond go on a later delivery.
pub const STALE_LISTING_KEYS_MAX: usize = 1_000;

/// Stale entries one delivery removes at most: the removals run in the
/// actor's turn, so a long list waits for later deliveries rather than hold
/// the actor through a thousand round trips.
pub const STALE_DELETES_PER_DELIVERY: usize = 16;

/// A PUT of an (empty) index entry, by its full bucket key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// The full key.
    pub key: String,
    /// `If-None-Match: *`. Tagged keys are fresh, so always; only the unsafe
    /// untagged variant overwrites.
    pub create_only: bool,
}

/// The index writes one commit brings, by full bucket key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// Listed before the upload that carries the commit.
    pub list_before: Option<Listing>,
    /// Listed after that upload landed: only under the unsafe
    /// [`crate::Variant::UploadBeforeEntry`], kept runnable for the
    /// simulator to catch.
    pub list_after: Option<Listing>,
    /// Removed once that upload landed: the entry the commit replaced (R2).
    pub remove_after: Option<String>,
}

impl Planned {
    fn is_empty(&self) -> bool {
        self.list_before.is_none() && self.list_after.is_none() && self.remove_after.is_none()
    }
}

/// One actor's planned index writes, each with the commit (counted from the
/// actor's opening) it belongs to, until an upload carries that commit.
#[derive(Clone, Debug, Default)]
pub struct IndexUpkeep {
    queued: Vec<(u64, Planned)>,
    /// The highest commit an upload round took (its writes left the ledger).
    carried: u64,
}

impl IndexUpkeep {
    /// Records what commit number `commit` writes to the index. Commits are
    /// planned in order, each after the last one an upload took.
    pub fn plan(&mut self, commit: u64, planned: Planned) {
        assert!(
            commit > self.carried,
            "commit {commit} planned after an upload carried commit {}",
            self.carried
        );
        assert!(
            self.queued.last().is_none_or(|(c, _)| *c <= commit),
            "commits are planned in order"
        );
        if !planned.is_empty() {
            self.queued.push((commit, planned));
        }
    }

    /// Drops what was planned for `commit` and later: the batch rolled back
    /// after planning, and removing the entry it replaced would unlist an
    /// alarm the database still names.
    pub fn forget_from(&mut self, commit: u64) {
        self.queued.retain(|(c, _)| *c < commit);
    }

    /// Whether writes wait for an upload.
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// The round of an upload that carries every commit up to `covered`:
    /// their writes leave the ledger with it. If the round gives the actor
    /// up, the driver starts the actor over (and the ledger with it).
    pub fn start_upload(&mut self, covered: u64) -> UploadRound {
        assert!(
            covered >= self.carried,
            "an upload carries commit {covered}, after one carried {}",
            self.carried
        );
        self.carried = covered;
        let (taken, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queued)
            .into_iter()
            .partition(|(c, _)| *c <= covered);
        self.queued = later;
        let mut round = UploadRound {
            listings: VecDeque::new(),
            remove: Vec::new(),
            list_late: Vec::new(),
            phase: Round::Listing,
            awaiting: false,
        };
        for (_, p) in taken {
            round.listings.extend(p.list_before);
            round.list_late.extend(p.list_after);
            round.remove.extend(p.remove_after);
        }
        round
    }
}

/// What an [`UploadRound`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpkeepEffect {
    /// PUT this empty entry and pass the answer to
    /// [`UploadRound::on_listed`].
    List(Listing),
    /// Upload the actor's commits the round covers and pass whether it
    /// landed to [`UploadRound::on_uploaded`].
    Upload,
    /// The upload landed: remove these replaced entries, and list these
    /// (the unsafe variant's late listings). Best effort: an entry a removal
    /// leaves is delivered once more and then removed as stale. The last
    /// effect.
    Landed {
        remove: Vec<String>,
        list_late: Vec<Listing>,
    },
    /// Give the actor up; nothing of the round's commits is known to be in
    /// the bucket. The last effect.
    GiveUp(GiveUp),
}

/// Why an [`UploadRound`] gave the actor up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// Listing this entry failed: nothing was uploaded.
    Listing { key: String },
    /// The upload failed.
    Upload,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Round {
    Listing,
    Uploading,
    Landed,
    GivingUp(GiveUp),
    Over,
}

/// One upload and the index writes around it.
#[derive(Clone, Debug)]
pub struct UploadRound {
    listings: VecDeque<Listing>,
    remove: Vec<String>,
    list_late: Vec<Listing>,
    phase: Round,
    awaiting: bool,
}

impl UploadRound {
    /// The next effect, or `None` while the round waits for an answer or is
    /// over.
    pub fn poll_effect(&mut self) -> Option<UpkeepEffect> {
        if self.awaiting {
            return None;
        }
        match &self.phase {
            Round::Listing => {
                if let Some(listing) = self.listings.front() {
                    self.awaiting = true;
                    return Some(UpkeepEffect::List(listing.clone()));
                }
                self.phase = Round::Uploading;
                self.awaiting = true;
                Some(UpkeepEffect::Upload)
            }
            Round::Uploading | Round::Over => None,
            Round::Landed => {
                self.phase = Round::Over;
                Some(UpkeepEffect::Landed {
                    remove: std::mem::take(&mut self.remove),
                    list_late: std::mem::take(&mut self.list_late),
                })
            }
            Round::GivingUp(why) => {
                let why = why.clone();
                self.phase = Round::Over;
                Some(UpkeepEffect::GiveUp(why))
            }
        }
    }

    /// The answer to the last [`UpkeepEffect::List`]. A create-only PUT
    /// that finds its key taken found this node's own earlier attempt: the
    /// key is fresh (R1).
    pub fn on_listed(&mut self, result: BucketResult) {
        assert!(
            self.awaiting && self.phase == Round::Listing,
            "a listing's answer while none was asked"
        );
        self.awaiting = false;
        let listing = self.listings.pop_front().expect("the listing asked");
        match result {
            BucketResult::Done | BucketResult::AlreadyExists => {}
            _ => self.phase = Round::GivingUp(GiveUp::Listing { key: listing.key }),
        }
    }

    /// Whether the upload asked by [`UpkeepEffect::Upload`] landed.
    pub fn on_uploaded(&mut self, landed: bool) {
        assert!(
            self.awaiting && self.phase == Round::Uploading,
            "an upload's answer while none was asked"
        );
        // Every entry the upload's commits name was listed first.
        assert!(self.listings.is_empty(), "uploaded before listing");
        self.awaiting = false;
        self.phase = if landed {
            Round::Landed
        } else {
            Round::GivingUp(GiveUp::Upload)
        };
    }
}

/// What a [`StaleCleanup`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CleanupEffect {
    /// Perform this operation (a listing page, then deletes) and pass its
    /// answer to [`StaleCleanup::on_result`].
    Bucket(BucketOp),
    /// The outcome. Emitted once.
    Done(CleanupOutcome),
}

/// How a [`StaleCleanup`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupOutcome {
    /// This many entries were removed; `newer_listed` of those listed were
    /// written under a generation above the owner's (left alone, R3).
    Cleaned { removed: u64, newer_listed: u64 },
    /// The bucket failed: deliver again later.
    Failed,
}

#[derive(Clone, Debug)]
enum Cleanup {
    Listing,
    Deleting(VecDeque<String>),
    Finished(Option<CleanupOutcome>),
}

/// Removes an actor's stale entries at one time from one index, in the
/// actor's turn (so no event of the actor lists a new entry meanwhile): R2
/// and R3 say which ([`stale_entries_to_delete`]): all but the one the
/// database names, none of a generation above the owner's.
#[derive(Clone, Debug)]
pub struct StaleCleanup {
    rules: Rules,
    prefix: String,
    address: Address,
    at_ms: u64,
    named: Option<Entry>,
    generation: u64,
    legacy_entries: bool,
    phase: Cleanup,
    awaiting: bool,
    removed: u64,
    newer_listed: u64,
}

impl StaleCleanup {
    /// The cleanup of `address`'s entries at `at_ms` in the index at
    /// `index_prefix`, by an owner under hold `generation` whose database
    /// names `named`. `legacy_entries`: the index may hold untagged entries
    /// from before tags (the simulator's seeded app indexes; an app's index
    /// on a node holds only tagged ones, so the runtime passes false and
    /// deletes no key that cannot exist).
    pub fn new(
        rules: Rules,
        index_prefix: &str,
        address: Address,
        at_ms: u64,
        named: Option<Entry>,
        generation: u64,
        legacy_entries: bool,
    ) -> StaleCleanup {
        StaleCleanup {
            rules,
            prefix: index_prefix.to_owned(),
            address,
            at_ms,
            named,
            generation,
            legacy_entries,
            phase: Cleanup::Listing,
            awaiting: false,
            removed: 0,
            newer_listed: 0,
        }
    }

    /// The next effect, or `None` while the machine waits for an answer or
    /// is over.
    pub fn poll_effect(&mut self) -> Option<CleanupEffect> {
        if self.awaiting {
            return None;
        }
        let op = match &mut self.phase {
            Cleanup::Listing => BucketOp::List {
                prefix: format!(
                    "{}{}",
                    self.prefix,
                    tagged_folder(self.at_ms, &self.address)
                ),
                start_after: None,
                limit: STALE_LISTING_KEYS_MAX,
            },
            Cleanup::Deleting(doomed) => match doomed.front() {
                Some(key) => BucketOp::Delete { key: key.clone() },
                None => {
                    self.phase = Cleanup::Finished(Some(CleanupOutcome::Cleaned {
                        removed: self.removed,
                        newer_listed: self.newer_listed,
                    }));
                    return self.poll_effect();
                }
            },
            Cleanup::Finished(outcome) => return outcome.take().map(CleanupEffect::Done),
        };
        self.awaiting = true;
        Some(CleanupEffect::Bucket(op))
    }

    /// The answer to the last [`CleanupEffect::Bucket`].
    pub fn on_result(&mut self, result: BucketResult) {
        assert!(self.awaiting, "an answer while none was asked");
        self.awaiting = false;
        match (&mut self.phase, result) {
            (Cleanup::Listing, BucketResult::Keys(keys)) => {
                let doomed = self.doomed(&keys);
                self.phase = Cleanup::Deleting(doomed);
            }
            (Cleanup::Deleting(doomed), BucketResult::Done) => {
                doomed.pop_front();
                self.removed += 1;
            }
            (Cleanup::Listing | Cleanup::Deleting(_), _) => {
                self.phase = Cleanup::Finished(Some(CleanupOutcome::Failed));
            }
            (Cleanup::Finished(_), _) => unreachable!("awaiting is false once finished"),
        }
    }

    /// What of a listing page may go, at most
    /// [`STALE_DELETES_PER_DELIVERY`] of it.
    fn doomed(&mut self, keys: &[String]) -> VecDeque<String> {
        let relative: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(&self.prefix))
            .map(str::to_owned)
            .collect();
        self.newer_listed = relative
            .iter()
            .filter_map(|k| IndexKey::parse(k).ok())
            .filter(|k| k.entry.generation() > self.generation)
            .count() as u64;
        let doomed = stale_entries_to_delete(
            self.rules,
            &self.address,
            self.at_ms,
            &relative,
            self.named.as_ref(),
            self.generation,
        );
        let out: VecDeque<String> = doomed
            .into_iter()
            .filter(|k| self.legacy_entries || k.entry.tag.is_some())
            .map(|k| format!("{}{}", self.prefix, k.to_key()))
            .take(STALE_DELETES_PER_DELIVERY)
            .collect();
        // R3's negative space: never an entry the database names, never one
        // of a newer owner (the rule checks generations unless an unsafe
        // variant turned that off).
        for key in &out {
            let k = IndexKey::parse(&key[self.prefix.len()..]).expect("built from a key");
            assert!(
                Some(&k.entry) != self.named.as_ref(),
                "removing the named entry"
            );
            assert!(
                !self.rules.generation_check() || k.entry.generation() <= self.generation,
                "removing a newer owner's entry"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(key: &str) -> Listing {
        Listing {
            key: key.into(),
            create_only: true,
        }
    }

    fn drive(round: &mut UploadRound, listed: BucketResult, landed: bool) -> Vec<UpkeepEffect> {
        let mut seen = Vec::new();
        while let Some(e) = round.poll_effect() {
            match &e {
                UpkeepEffect::List(_) => round.on_listed(listed.clone()),
                UpkeepEffect::Upload => round.on_uploaded(landed),
                _ => {}
            }
            seen.push(e);
        }
        seen
    }

    #[test]
    fn a_round_lists_every_carried_commit_before_it_uploads_and_removes_after() {
        let mut upkeep = IndexUpkeep::default();
        upkeep.plan(
            1,
            Planned {
                list_before: Some(listing("a")),
                ..Planned::default()
            },
        );
        upkeep.plan(
            2,
            Planned {
                list_before: Some(listing("b")),
                remove_after: Some("a".into()),
                ..Planned::default()
            },
        );
        upkeep.plan(
            3,
            Planned {
                remove_after: Some("b".into()),
                ..Planned::default()
            },
        );
        let mut round = upkeep.start_upload(2);
        let seen = drive(&mut round, BucketResult::Done, true);
        assert_eq!(
            seen,
            [
                UpkeepEffect::List(listing("a")),
                UpkeepEffect::List(listing("b")),
                UpkeepEffect::Upload,
                UpkeepEffect::Landed {
                    remove: vec!["a".into()],
                    list_late: vec![]
                },
            ]
        );
        // Commit 3's removal waits for the upload that carries it.
        assert!(!upkeep.is_empty());
        let seen = drive(&mut upkeep.start_upload(3), BucketResult::Done, true);
        assert_eq!(seen[0], UpkeepEffect::Upload);
        assert!(upkeep.is_empty());
    }

    #[test]
    fn a_failed_listing_gives_the_actor_up_with_nothing_uploaded() {
        let mut upkeep = IndexUpkeep::default();
        upkeep.plan(
            1,
            Planned {
                list_before: Some(listing("a")),
                remove_after: Some("old".into()),
                ..Planned::default()
            },
        );
        let seen = drive(&mut upkeep.start_upload(1), BucketResult::Failed, true);
        assert_eq!(
            seen,
            [
                UpkeepEffect::List(listing("a")),
                UpkeepEffect::GiveUp(GiveUp::Listing { key: "a".into() })
            ]
        );
    }

    #[test]
    fn a_key_found_taken_is_the_nodes_own_earlier_attempt() {
        let mut upkeep = IndexUpkeep::default();
        upkeep.plan(
            1,
            Planned {
                list_before: Some(listing("a")),
                ..Planned::default()
            },
        );
        let seen = drive(
            &mut upkeep.start_upload(1),
            BucketResult::AlreadyExists,
            true,
        );
        assert_eq!(seen[1], UpkeepEffect::Upload);
    }

    #[test]
    fn a_failed_upload_removes_nothing() {
        let mut upkeep = IndexUpkeep::default();
        upkeep.plan(
            1,
            Planned {
                remove_after: Some("old".into()),
                ..Planned::default()
            },
        );
        let seen = drive(&mut upkeep.start_upload(1), BucketResult::Done, false);
        assert_eq!(
            seen,
            [UpkeepEffect::Upload, UpkeepEffect::GiveUp(GiveUp::Upload)]
        );
    }

    #[test]
    fn a_rolled_back_commit_removes_nothing() {
        let mut upkeep = IndexUpkeep::default();
        upkeep.plan(
            1,
            Planned {
                remove_after: Some("named-still".into()),
                ..Planned::default()
            },
        );
        upkeep.forget_from(1);
        assert!(upkeep.is_empty());
    }

    #[test]
    #[should_panic(expected = "after an upload carried")]
    fn planning_for_a_carried_commit_is_a_bug() {
        let mut upkeep = IndexUpkeep::default();
        let _ = upkeep.start_upload(2);
        upkeep.plan(2, Planned::default());
    }

    fn cleanup(named: Option<Entry>, legacy: bool) -> StaleCleanup {
        let address = Address::new("room", "a").unwrap();
        StaleCleanup::new(Rules::SAFE, "idx/", address, 5_000, named, 3, legacy)
    }

    fn key_of(entry: Entry) -> String {
        let address = Address::new("room", "a").unwrap();
        format!("idx/{}", IndexKey { address, entry }.to_key())
    }

    #[test]
    fn a_cleanup_removes_all_but_the_named_and_the_newer_owners() {
        let named = Entry::tagged(5_000, 2, 1);
        let stale = Entry::tagged(5_000, 1, 9);
        let newer = Entry::tagged(5_000, 4, 7);
        let mut c = cleanup(Some(named), false);
        let Some(CleanupEffect::Bucket(BucketOp::List { .. })) = c.poll_effect() else {
            panic!("lists first");
        };
        c.on_result(BucketResult::Keys(vec![
            key_of(named),
            key_of(stale),
            key_of(newer),
        ]));
        assert_eq!(
            c.poll_effect(),
            Some(CleanupEffect::Bucket(BucketOp::Delete {
                key: key_of(stale)
            }))
        );
        c.on_result(BucketResult::Done);
        assert_eq!(
            c.poll_effect(),
            Some(CleanupEffect::Done(CleanupOutcome::Cleaned {
                removed: 1,
                newer_listed: 1
            }))
        );
        assert_eq!(c.poll_effect(), None);
    }

    #[test]
    fn a_cleanup_deletes_the_legacy_key_only_where_one_can_be() {
        for (legacy, deletes) in [(false, 0), (true, 1)] {
            let mut c = cleanup(None, legacy);
            c.poll_effect();
            c.on_result(BucketResult::Keys(vec![]));
            let mut n = 0;
            while let Some(CleanupEffect::Bucket(_)) = c.poll_effect() {
                n += 1;
                c.on_result(BucketResult::Done);
            }
            assert_eq!(n, deletes);
        }
    }

    #[test]
    fn a_cleanup_removes_a_bounded_number_per_delivery() {
        let mut c = cleanup(None, false);
        c.poll_effect();
        let keys = (0..40)
            .map(|n| key_of(Entry::tagged(5_000, 1, n)))
            .collect();
        c.on_result(BucketResult::Keys(keys));
        let mut n = 0;
        while let Some(CleanupEffect::Bucket(_)) = c.poll_effect() {
            n += 1;
            c.on_result(BucketResult::Done);
        }
        assert_eq!(n, STALE_DELETES_PER_DELIVERY);
    }

    #[test]
    fn a_failed_delete_fails_the_cleanup() {
        let mut c = cleanup(None, false);
        c.poll_effect();
        c.on_result(BucketResult::Keys(vec![key_of(Entry::tagged(5_000, 1, 1))]));
        c.poll_effect();
        c.on_result(BucketResult::Failed);
        assert_eq!(
            c.poll_effect(),
            Some(CleanupEffect::Done(CleanupOutcome::Failed))
        );
    }
}
