//! ADR 0009's alarm index: the key format, the `alarm_indexed` record, and the
//! owner's rules as pure decisions.
//!
//! Keys are relative to an index prefix the caller owns: an app's index
//! below the app's root ([`app_index_prefix`], `state/<tenant>/<app>/_alarms/`,
//! ADR 0035), or the tenant-wide index ADR 0009 first wrote
//! ([`tenant_index_prefix`], `alarms/<tenant>/`, read and migrated only):
//!
//! ```text
//! <due ms, 15 digits>/<class>.t/<name hex>/<generation, 20 digits>-<nonce, 16 hex>   tagged
//! <due ms, 15 digits>/<class>/<name hex>                                               legacy
//! ```
//!
//! `<name hex>` is one folder for names up to 100 bytes. A longer name's hex
//! is split into folders of [`HEX_SEGMENT_CHARS`], every one but the last
//! ending in `+` (a character hex never has), exactly as the store and the
//! replica split it: a local folder (`file://`) holds 255-byte names, and
//! a name of up to [`NAME_BYTES_MAX`] bytes is 512 hex characters. Keys of
//! names up to 100 bytes are as before; no bucket held keys of longer names
//! before this split (only the simulator's), so only the split form parses.
//!
//! The due time comes first and zero-padded, so a listing in key order yields
//! the earliest alarms first. The name is lowercase hex, so no store escapes
//! anything. Class names have no `.`, so the tagged folder `<class>.t` is never
//! a legacy class and no key is both an object and the folder of others.

use crate::config::{
    CLASS_BYTES_MAX, ClusterConfig, HEX_SEGMENT_CHARS, NAME_BYTES_MAX, NAME_TOO_LONG,
};
use crate::error::Error;
use crate::rules::Rules;
use crate::{hex_decode, hex_encode, parse_fixed_digits, parse_fixed_hex};

/// Digits of the due time in a key.
pub const DUE_DIGITS: usize = 15;
/// The latest due time a key can hold.
pub const DUE_MAX_MS: u64 = 999_999_999_999_999;
/// Digits of a generation in a key.
pub const GENERATION_DIGITS: usize = 20;
/// Hex digits of a nonce in a key.
pub const NONCE_HEX_DIGITS: usize = 16;
const TAGGED_SUFFIX: &str = ".t";

/// An actor's address within its app: its class and its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Address {
    class: String,
    name: String,
}

impl Address {
    /// Validates a class name (ASCII letters, digits, `-`, `_`; never `.`) and a
    /// name (non-empty UTF-8 up to [`NAME_BYTES_MAX`] bytes).
    pub fn new(class: impl Into<String>, name: impl Into<String>) -> Result<Address, Error> {
        let class = class.into();
        let name = name.into();
        validate_class(&class)?;
        if name.is_empty() {
            return Err(Error::InvalidName {
                reason: "empty",
                bytes: 0,
            });
        }
        if name.len() > NAME_BYTES_MAX {
            return Err(Error::InvalidName {
                reason: NAME_TOO_LONG,
                bytes: name.len(),
            });
        }
        Ok(Address { class, name })
    }

    /// The class name.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The actor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as hex, unsplit.
    pub fn name_hex(&self) -> String {
        hex_encode(self.name.as_bytes())
    }

    /// The name as it appears in keys: its hex in folders of at most
    /// [`HEX_SEGMENT_CHARS`], every one but the last ending in `+`, joined
    /// by `/`.
    pub fn name_key(&self) -> String {
        let hex = self.name_hex();
        let chunks: Vec<&str> = hex
            .as_bytes()
            .chunks(HEX_SEGMENT_CHARS)
            .map(|c| std::str::from_utf8(c).expect("hex is ascii"))
            .collect();
        chunks.join("+/")
    }

    /// `<class>/<name key>`: the actor's folder below an app root, and what
    /// the sweep shards on.
    pub fn path(&self) -> String {
        format!("{}/{}", self.class, self.name_key())
    }
}

fn validate_class(class: &str) -> Result<(), Error> {
    let ok = !class.is_empty()
        && class.len() <= CLASS_BYTES_MAX
        && class
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidClass {
            class: class.to_owned(),
        })
    }
}

/// The tag of an entry: the generation of the hold its writer owned the actor
/// under, and a nonce that writer never used before (R1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag {
    /// The writer's hold generation (ADR 0020); generations start at 1.
    pub generation: u64,
    /// A random number drawn by the caller for this PUT.
    pub nonce: u64,
}

/// One entry of an actor in the index, without the actor: what
/// `alarm_indexed` records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// The alarm's due time in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The tag; `None` for a legacy entry.
    pub tag: Option<Tag>,
}

impl Entry {
    /// A tagged entry.
    pub fn tagged(at_ms: u64, generation: u64, nonce: u64) -> Entry {
        Entry {
            at_ms,
            tag: Some(Tag { generation, nonce }),
        }
    }

    /// A legacy (untagged) entry.
    pub fn legacy(at_ms: u64) -> Entry {
        Entry { at_ms, tag: None }
    }

    /// The writer's generation; legacy entries count as generation 0, below
    /// every owner's, since they were written before generations existed.
    pub fn generation(&self) -> u64 {
        self.tag.map_or(0, |t| t.generation)
    }

    /// The `alarm_indexed` value: `<at>/<tag>`, a bare `<at>` for a legacy
    /// entry, empty for none.
    pub fn to_meta(entry: Option<&Entry>) -> String {
        match entry {
            None => String::new(),
            Some(Entry { at_ms, tag: None }) => format!("{at_ms:015}"),
            Some(Entry {
                at_ms,
                tag: Some(t),
            }) => format!("{at_ms:015}/{}", format_tag(t)),
        }
    }

    /// Parses an `alarm_indexed` value written by [`Entry::to_meta`].
    pub fn parse_meta(meta: &str) -> Result<Option<Entry>, Error> {
        if meta.is_empty() {
            return Ok(None);
        }
        let bad = |reason| Error::MalformedRecord {
            reason,
            record: meta.to_owned(),
        };
        let (at, tag) = match meta.split_once('/') {
            Some((at, tag)) => (at, Some(tag)),
            None => (meta, None),
        };
        let at_ms = parse_fixed_digits(at, DUE_DIGITS).ok_or_else(|| bad("due time"))?;
        let tag = match tag {
            None => None,
            Some(t) => Some(parse_tag(t).ok_or_else(|| bad("tag"))?),
        };
        Ok(Some(Entry { at_ms, tag }))
    }
}

fn format_tag(t: &Tag) -> String {
    format!("{:020}-{:016x}", t.generation, t.nonce)
}

fn parse_tag(text: &str) -> Option<Tag> {
    let (generation, nonce) = text.split_once('-')?;
    Some(Tag {
        generation: parse_fixed_digits(generation, GENERATION_DIGITS)?,
        nonce: parse_fixed_hex(nonce, NONCE_HEX_DIGITS)?,
    })
}

/// One key of the index: an actor and one of its entries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexKey {
    /// The actor.
    pub address: Address,
    /// The entry.
    pub entry: Entry,
}

impl IndexKey {
    /// Builds a key, checking that the due time fits its 15 digits.
    pub fn new(address: Address, entry: Entry) -> Result<IndexKey, Error> {
        if entry.at_ms > DUE_MAX_MS {
            return Err(Error::TimeOutOfRange { at_ms: entry.at_ms });
        }
        Ok(IndexKey { address, entry })
    }

    /// The key relative to the index prefix.
    pub fn to_key(&self) -> String {
        let at = self.entry.at_ms;
        let class = &self.address.class;
        let name = self.address.name_key();
        match &self.entry.tag {
            None => format!("{at:015}/{class}/{name}"),
            Some(t) => format!("{at:015}/{class}{TAGGED_SUFFIX}/{name}/{}", format_tag(t)),
        }
    }

    /// Parses a key relative to the index prefix, rejecting anything that
    /// [`IndexKey::to_key`] would not have written.
    pub fn parse(key: &str) -> Result<IndexKey, Error> {
        let bad = |reason| Error::MalformedKey {
            reason,
            key: key.to_owned(),
        };
        let segments: Vec<&str> = key.split('/').collect();
        if segments.len() < 3 {
            return Err(bad("segment count"));
        }
        let at_ms = parse_fixed_digits(segments[0], DUE_DIGITS).ok_or_else(|| bad("due time"))?;
        let (class, tagged) = match segments[1].strip_suffix(TAGGED_SUFFIX) {
            Some(class) => (class, true),
            None => (segments[1], false),
        };
        validate_class(class).map_err(|_| bad("class"))?;
        let name_end = segments.len() - usize::from(tagged);
        let name_hex =
            join_name_segments(&segments[2..name_end]).ok_or_else(|| bad("name segments"))?;
        let name_bytes = hex_decode(&name_hex).ok_or_else(|| bad("name hex"))?;
        let name = String::from_utf8(name_bytes).map_err(|_| bad("name utf-8"))?;
        let tag = if tagged {
            Some(parse_tag(segments[name_end]).ok_or_else(|| bad("tag"))?)
        } else {
            None
        };
        let address = Address::new(class, name).map_err(|_| bad("name"))?;
        Ok(IndexKey {
            address,
            entry: Entry { at_ms, tag },
        })
    }

    /// Parses a full key, stripping the index prefix first.
    pub fn parse_full(prefix: &str, key: &str) -> Result<IndexKey, Error> {
        let rel = key
            .strip_prefix(prefix)
            .ok_or_else(|| Error::MalformedKey {
                reason: "outside the index prefix",
                key: key.to_owned(),
            })?;
        IndexKey::parse(rel)
    }
}

/// The hex of a name from its folders, accepting only the one spelling
/// [`Address::name_key`] writes: every folder but the last exactly
/// [`HEX_SEGMENT_CHARS`] long and ending in `+`, the last one shorter or as
/// long, without `+`, and not empty.
fn join_name_segments(segments: &[&str]) -> Option<String> {
    let (last, full) = segments.split_last()?;
    let mut hex = String::new();
    for s in full {
        let part = s.strip_suffix('+')?;
        if part.len() != HEX_SEGMENT_CHARS {
            return None;
        }
        hex.push_str(part);
    }
    if last.is_empty() || last.len() > HEX_SEGMENT_CHARS || last.ends_with('+') {
        return None;
    }
    hex.push_str(last);
    Some(hex)
}

/// The due-time part of a relative key, if it has one: lets a sweep stop at
/// the first entry not yet due even when that entry is malformed otherwise.
pub fn due_of_key(key: &str) -> Option<u64> {
    parse_fixed_digits(key.get(..DUE_DIGITS)?, DUE_DIGITS)
        .filter(|_| key.as_bytes().get(DUE_DIGITS) == Some(&b'/'))
}

/// The folder that holds an actor's tagged entries at one time; listing it is
/// how stale-entry cleanup finds them.
pub fn tagged_folder(at_ms: u64, address: &Address) -> String {
    format!(
        "{at_ms:015}/{}{TAGGED_SUFFIX}/{}/",
        address.class,
        address.name_key()
    )
}

/// The alarm state an actor's database holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlarmState {
    /// The committed alarm (the retry time while retrying).
    pub at_ms: Option<u64>,
    /// `alarm_indexed`: the exact entry listed for the alarm.
    pub indexed: Option<Entry>,
    /// Failed `on-alarm` runs since the alarm was last set or cleared.
    pub retry_count: u32,
}

/// A PUT of an index entry: an empty object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Put {
    /// The key to write.
    pub key: IndexKey,
    /// Whether the write is create-only (`If-None-Match: *`). Tagged keys are
    /// always fresh; only the unsafe untagged variant overwrites.
    pub create_only: bool,
}

/// What an owner does around replicating one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPlan {
    /// List the committed alarm before replicating; if this fails, give the
    /// actor up instead of replicating.
    pub put_before_upload: Option<Put>,
    /// The `alarm_indexed` value to commit with the event.
    pub record: Option<Entry>,
    /// Remove the replaced entry once the event is replicated (R2).
    pub delete_after_upload: Option<IndexKey>,
}

fn fresh_entry(
    rules: Rules,
    address: &Address,
    at_ms: u64,
    generation: u64,
    nonce: u64,
) -> Result<Put, Error> {
    let entry = if rules.tagged_keys() {
        Entry::tagged(at_ms, generation, nonce)
    } else {
        Entry::legacy(at_ms)
    };
    Ok(Put {
        key: IndexKey::new(address.clone(), entry)?,
        create_only: entry.tag.is_some(),
    })
}

/// The owner's rule for one event: the index stays equal to the committed
/// alarm. `indexed_before` is what the database recorded before the event;
/// `alarm_after` the alarm the event commits; `generation` the owner's hold;
/// `nonce` a fresh random number (R1).
///
/// An unchanged alarm keeps its entry, whichever owner wrote it; a legacy
/// entry is replaced by a tagged one (migration); a new time gets a fresh key.
pub fn plan_event(
    rules: Rules,
    address: &Address,
    indexed_before: Option<&Entry>,
    alarm_after: Option<u64>,
    generation: u64,
    nonce: u64,
) -> Result<EventPlan, Error> {
    let old_key = |e: &Entry| IndexKey {
        address: address.clone(),
        entry: *e,
    };
    match (alarm_after, indexed_before) {
        (None, before) => Ok(EventPlan {
            put_before_upload: None,
            record: None,
            delete_after_upload: before.map(old_key),
        }),
        (Some(at), Some(before))
            if before.at_ms == at && (before.tag.is_some() || !rules.tagged_keys()) =>
        {
            Ok(EventPlan {
                put_before_upload: None,
                record: Some(*before),
                delete_after_upload: None,
            })
        }
        (Some(at), before) => {
            let put = fresh_entry(rules, address, at, generation, nonce)?;
            Ok(EventPlan {
                record: Some(put.key.entry),
                put_before_upload: Some(put),
                delete_after_upload: before.map(old_key),
            })
        }
    }
}

/// What a joining node does with an actor the bucket has nothing for (R4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstUploadPlan {
    /// List the alarm before the first upload; if this fails, upload nothing.
    pub put_before_upload: Option<Put>,
    /// The `alarm_indexed` value the first snapshot carries.
    pub record: Option<Entry>,
    /// Only under [`crate::Variant::UploadBeforeEntry`]: the PUT after the upload.
    pub put_after_upload: Option<Put>,
}

/// R4: an alarm from before joining is listed before the first upload, so the
/// first snapshot names an entry that exists.
pub fn plan_first_upload(
    rules: Rules,
    address: &Address,
    local_alarm: Option<u64>,
    generation: u64,
    nonce: u64,
) -> Result<FirstUploadPlan, Error> {
    let Some(at) = local_alarm else {
        return Ok(FirstUploadPlan {
            put_before_upload: None,
            record: None,
            put_after_upload: None,
        });
    };
    let put = fresh_entry(rules, address, at, generation, nonce)?;
    let record = Some(put.key.entry);
    if rules.entry_before_first_upload() {
        Ok(FirstUploadPlan {
            put_before_upload: Some(put),
            record,
            put_after_upload: None,
        })
    } else {
        Ok(FirstUploadPlan {
            put_before_upload: None,
            record,
            put_after_upload: Some(put),
        })
    }
}

/// What a delivery of an entry at `delivered_at_ms` means for the actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The committed alarm is at that time and due: run `on-alarm`.
    Run,
    /// The committed alarm is at that time but not due yet (a clock behind the
    /// sweep's): keep it in the timer until then.
    NotDue { at_ms: u64 },
    /// The entry no longer matches the committed alarm: it is stale; follow
    /// [`next_stale_step`].
    Stale,
}

/// Decides what a delivered entry means, given the committed alarm.
pub fn plan_delivery(delivered_at_ms: u64, committed_at_ms: Option<u64>, now_ms: u64) -> Delivery {
    match committed_at_ms {
        Some(at) if at == delivered_at_ms && at <= now_ms => Delivery::Run,
        Some(at) if at == delivered_at_ms => Delivery::NotDue { at_ms: at },
        _ => Delivery::Stale,
    }
}

/// What the owner knows when it handles a stale entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleContext<'a> {
    /// The time of the delivered entry.
    pub delivered_at_ms: u64,
    /// The committed alarm state the owner restored (or wrote since).
    pub committed: &'a AlarmState,
    /// Whether the owner found any state for the actor in the bucket.
    pub bucket_had_state: bool,
    /// Whether the owner's own upload has landed since it took the actor.
    pub uploaded_since_take: bool,
}

/// The next step of stale-entry cleanup. The owner repeats
/// [`next_stale_step`] after each step until it gets `ListAndDelete` or
/// `LeaveAndRelease`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleStep {
    /// The committed alarm is not indexed under a tagged key: run an event that
    /// keeps the alarm ([`plan_event`] migrates it) before removing anything.
    IndexCommitted,
    /// Upload `owner_fence` first: until the owner's own upload ends the
    /// history, an earlier owner's late upload can still become the state and
    /// name an entry about to be removed.
    Fence,
    /// List [`tagged_folder`] and delete what [`stale_entries_to_delete`] says.
    ListAndDelete,
    /// The bucket had nothing and the owner uploaded nothing: remove nothing,
    /// upload nothing (that would create the actor empty), retry the entry at
    /// `retry_at_ms`, and release the actor's hold at once.
    LeaveAndRelease { retry_at_ms: u64 },
}

/// R2's conditions for removing stale entries.
pub fn next_stale_step(
    rules: Rules,
    ctx: &StaleContext<'_>,
    config: &ClusterConfig,
    now_ms: u64,
) -> StaleStep {
    if !ctx.bucket_had_state && !ctx.uploaded_since_take {
        // An earlier owner's first snapshot can name an entry (R4) and still land.
        if rules.keep_on_empty_bucket() {
            return StaleStep::LeaveAndRelease {
                retry_at_ms: now_ms + config.retry_max_ms,
            };
        }
        return StaleStep::ListAndDelete;
    }
    if let Some(at) = ctx.committed.at_ms {
        let indexed_here = ctx
            .committed
            .indexed
            .is_some_and(|e| e.at_ms == at && (e.tag.is_some() || !rules.tagged_keys()));
        if !indexed_here {
            return StaleStep::IndexCommitted;
        }
    }
    if !ctx.uploaded_since_take && rules.owner_fence() {
        return StaleStep::Fence;
    }
    StaleStep::ListAndDelete
}

/// R2 and R3 for one stale time: of the actor's entries at `at_ms` (those the
/// listing of [`tagged_folder`] returned, plus the legacy key, deleted by its
/// exact name), every one except the entry the database names, and none with a
/// generation above the owner's. Listed keys that do not parse, or belong to
/// another actor or time, are never deleted.
pub fn stale_entries_to_delete(
    rules: Rules,
    address: &Address,
    at_ms: u64,
    listed: &[String],
    named: Option<&Entry>,
    generation: u64,
) -> Vec<IndexKey> {
    let mut out: Vec<IndexKey> = listed
        .iter()
        .filter_map(|k| IndexKey::parse(k).ok())
        .filter(|k| &k.address == address && k.entry.at_ms == at_ms && k.entry.tag.is_some())
        .filter(|k| Some(&k.entry) != named)
        .filter(|k| !rules.generation_check() || k.entry.generation() <= generation)
        .collect();
    let legacy = Entry::legacy(at_ms);
    if Some(&legacy) != named {
        out.push(IndexKey {
            address: address.clone(),
            entry: legacy,
        });
    }
    out.sort();
    out.dedup();
    out
}

/// Where an app's index lives: below the app's root (ADR 0022's layout), so
/// that two apps of a tenant with the same class and actor names never share
/// an entry, and one app's cleanup never touches another's. The folder is
/// `_alarms`, a name no class can take (a class starts with a letter or a
/// digit), so no actor's chain is ever inside the index.
pub fn app_index_prefix(tenant: &str, app: &str) -> String {
    format!("state/{tenant}/{app}/_alarms/")
}

/// Where ADR 0009 first kept the index, for a whole tenant and without the
/// app. Read (swept, delivered to every app of the tenant that has the
/// class) and migrated on an actor's next event; never written.
pub fn tenant_index_prefix(tenant: &str) -> String {
    format!("alarms/{tenant}/")
}

/// Which of the two index layouts an entry is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Below the app's root ([`app_index_prefix`]): what owners write.
    App,
    /// The tenant-wide index without the app ([`tenant_index_prefix`]).
    Tenant,
}

/// What `alarm_indexed` names: an entry and the layout it is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Indexed {
    /// The layout the entry is in.
    pub layout: Layout,
    /// The entry.
    pub entry: Entry,
}

/// How an `alarm_indexed` value marks an entry in the app's index; a value
/// without it names an entry in the tenant-wide index (written before the
/// app was part of the address).
const APP_LAYOUT_MARK: &str = "app:";

impl Indexed {
    /// An entry in the app's index.
    pub fn app(entry: Entry) -> Indexed {
        Indexed {
            layout: Layout::App,
            entry,
        }
    }

    /// The `alarm_indexed` value; empty for none.
    pub fn to_meta(indexed: Option<&Indexed>) -> String {
        match indexed {
            None => String::new(),
            Some(i) => match i.layout {
                Layout::App => format!("{APP_LAYOUT_MARK}{}", Entry::to_meta(Some(&i.entry))),
                Layout::Tenant => Entry::to_meta(Some(&i.entry)),
            },
        }
    }

    /// Parses an `alarm_indexed` value written by [`Indexed::to_meta`] or,
    /// before the app was in the address, by [`Entry::to_meta`].
    pub fn parse_meta(meta: &str) -> Result<Option<Indexed>, Error> {
        let (layout, rest) = match meta.strip_prefix(APP_LAYOUT_MARK) {
            Some(rest) if !rest.is_empty() => (Layout::App, rest),
            Some(_) => {
                return Err(Error::MalformedRecord {
                    reason: "app mark without an entry",
                    record: meta.to_owned(),
                });
            }
            None => (Layout::Tenant, meta),
        };
        Ok(Entry::parse_meta(rest)?.map(|entry| Indexed { layout, entry }))
    }
}

/// [`plan_event`] across the two layouts: what the owner writes is always
/// in the app's index; an entry the database names in the tenant-wide
/// index is replaced by one in the app's (migration), and removed after
/// the upload like any replaced entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutPlan {
    /// PUT in the app's index before the upload.
    pub put_before_upload: Option<Put>,
    /// The new `alarm_indexed` value.
    pub record: Option<Indexed>,
    /// Remove after the upload: the replaced entry and its layout.
    pub delete_after_upload: Option<(Layout, IndexKey)>,
}

/// The owner's rule for one event over both layouts: [`plan_event`] for an
/// entry in the app's index; for one in the tenant-wide index, a fresh
/// entry in the app's index whenever an alarm is set (the tenant-wide one
/// is then replaced, so removed after the upload).
pub fn plan_event_in_layouts(
    rules: Rules,
    address: &Address,
    indexed_before: Option<&Indexed>,
    alarm_after: Option<u64>,
    generation: u64,
    nonce: u64,
) -> Result<LayoutPlan, Error> {
    match indexed_before {
        Some(Indexed {
            layout: Layout::Tenant,
            entry,
        }) => {
            let p = plan_event(rules, address, None, alarm_after, generation, nonce)?;
            Ok(LayoutPlan {
                put_before_upload: p.put_before_upload,
                record: p.record.map(Indexed::app),
                delete_after_upload: Some((
                    Layout::Tenant,
                    IndexKey {
                        address: address.clone(),
                        entry: *entry,
                    },
                )),
            })
        }
        before => {
            let before = before.map(|i| i.entry);
            let p = plan_event(
                rules,
                address,
                before.as_ref(),
                alarm_after,
                generation,
                nonce,
            )?;
            Ok(LayoutPlan {
                put_before_upload: p.put_before_upload,
                record: p.record.map(Indexed::app),
                delete_after_upload: p.delete_after_upload.map(|k| (Layout::App, k)),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Variant;

    fn addr() -> Address {
        Address::new("room", "lobby/1 é").unwrap()
    }

    /// A tiny splitmix64 so the randomised tests need no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn random_key(rng: &mut Rng) -> IndexKey {
        const CLASS_CHARS: &[u8] = b"abcXYZ019-_";
        let class: String = (0..1 + rng.below(8))
            .map(|_| CLASS_CHARS[rng.below(11) as usize] as char)
            .collect();
        // Mostly short names, and now and then one long enough to be split
        // (up to 85 characters of up to 3 bytes: within the limit).
        let chars = if rng.below(4) == 0 {
            1 + rng.below(85)
        } else {
            1 + rng.below(12)
        };
        let name: String = (0..chars)
            .map(|_| char::from_u32(rng.below(0x3000) as u32 + 1).unwrap_or('x'))
            .collect();
        let at = rng.below(DUE_MAX_MS + 1);
        let entry = if rng.below(4) == 0 {
            Entry::legacy(at)
        } else {
            Entry::tagged(at, rng.next(), rng.next())
        };
        IndexKey::new(Address::new(class, name).unwrap(), entry).unwrap()
    }

    #[test]
    fn the_record_tells_the_two_layouts_apart_and_migrates_the_tenant_one() {
        let app = Indexed::app(Entry::tagged(5, 2, 3));
        let tenant = Indexed {
            layout: Layout::Tenant,
            entry: Entry::tagged(5, 2, 3),
        };
        for i in [app, tenant, Indexed::app(Entry::legacy(7))] {
            assert_eq!(
                Indexed::parse_meta(&Indexed::to_meta(Some(&i))),
                Ok(Some(i))
            );
        }
        assert_eq!(Indexed::parse_meta(""), Ok(None));
        assert!(Indexed::parse_meta("app:").is_err());
        assert_ne!(
            Indexed::to_meta(Some(&app)),
            Indexed::to_meta(Some(&tenant))
        );
        assert_eq!(app_index_prefix("t", "a"), "state/t/a/_alarms/");
        // The same alarm named in the tenant-wide index: a fresh entry in the
        // app's, the old one removed after the upload.
        let p = plan_event_in_layouts(Rules::SAFE, &addr(), Some(&tenant), Some(5), 4, 9).unwrap();
        assert_eq!(
            p.put_before_upload.unwrap().key.entry,
            Entry::tagged(5, 4, 9)
        );
        assert_eq!(p.record, Some(Indexed::app(Entry::tagged(5, 4, 9))));
        assert_eq!(p.delete_after_upload.unwrap().0, Layout::Tenant);
        // Named in the app's index and unchanged: nothing to do.
        let p = plan_event_in_layouts(Rules::SAFE, &addr(), Some(&app), Some(5), 4, 9).unwrap();
        assert_eq!(
            (p.put_before_upload, p.record, p.delete_after_upload),
            (None, Some(app), None)
        );
    }

    #[test]
    fn keys_round_trip_over_many_random_keys() {
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let k = random_key(&mut rng);
            let text = k.to_key();
            assert_eq!(IndexKey::parse(&text).as_ref(), Ok(&k), "{text}");
            assert_eq!(due_of_key(&text), Some(k.entry.at_ms));
            assert_eq!(
                Entry::parse_meta(&Entry::to_meta(Some(&k.entry))),
                Ok(Some(k.entry))
            );
        }
        assert_eq!(Entry::parse_meta(""), Ok(None));
    }

    #[test]
    fn keys_sort_by_due_time_first() {
        let mut rng = Rng(11);
        let mut keys: Vec<IndexKey> = (0..2_000).map(|_| random_key(&mut rng)).collect();
        let mut texts: Vec<String> = keys.iter().map(IndexKey::to_key).collect();
        texts.sort();
        keys.sort_by_key(|k| k.entry.at_ms);
        let dues: Vec<u64> = texts.iter().map(|t| due_of_key(t).unwrap()).collect();
        assert!(dues.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn the_longest_name_splits_into_short_folders_and_parses_back() {
        let longest = "é".repeat(NAME_BYTES_MAX / 2);
        let a = Address::new("room", longest.clone()).unwrap();
        for entry in [Entry::legacy(5), Entry::tagged(5, 7, 9)] {
            let key = IndexKey::new(a.clone(), entry).unwrap();
            let text = key.to_key();
            assert_eq!(IndexKey::parse(&text).unwrap(), key);
            // A local folder holds names of 255 bytes.
            assert!(
                text.split('/').all(|f| f.len() <= HEX_SEGMENT_CHARS + 1),
                "{text}"
            );
            assert_eq!(text.matches("+/").count(), 2);
        }
        assert!(
            tagged_folder(5, &a).starts_with(&format!("000000000000005/room.t/{}", a.name_key()))
        );
        // Short names keep their one folder.
        assert_eq!(addr().name_key(), addr().name_hex());
        // A split that is not the one spelling is refused.
        let text = IndexKey::new(a, Entry::legacy(5)).unwrap().to_key();
        let unsplit = text.replace("+/", "");
        assert!(IndexKey::parse(&unsplit).is_err());
        // One byte more is refused, naming the limit.
        let e = Address::new("room", format!("{longest}x")).unwrap_err();
        assert!(e.to_string().contains("name_bytes_max=256"), "{e}");
    }

    #[test]
    fn no_key_is_both_an_object_and_a_folder() {
        // Every combination an actor can have at one time: legacy and tagged
        // entries of classes whose names extend each other.
        let mut keys = Vec::new();
        let long = "x".repeat(HEX_SEGMENT_CHARS / 2);
        let longer = "x".repeat(HEX_SEGMENT_CHARS / 2 + 1);
        for class in ["a", "a-t", "at", "a_t", "t"] {
            for name in ["x", "xy", long.as_str(), longer.as_str()] {
                let a = Address::new(class, name).unwrap();
                keys.push(IndexKey::new(a.clone(), Entry::legacy(5)).unwrap().to_key());
                keys.push(IndexKey::new(a, Entry::tagged(5, 1, 2)).unwrap().to_key());
            }
        }
        for k in &keys {
            let folder = format!("{k}/");
            assert!(
                !keys.iter().any(|o| o.starts_with(&folder)),
                "{k} is also a folder"
            );
        }
    }

    #[test]
    fn malformed_keys_are_rejected() {
        let good_tagged = "000000000001000/room.t/6c6f626279/00000000000000000003-00000000000000ff";
        let good_legacy = "000000000001000/room/6c6f626279";
        assert!(IndexKey::parse(good_tagged).is_ok());
        assert!(IndexKey::parse(good_legacy).is_ok());
        for bad in [
            "",
            "00000000001000/room/6c6f626279",   // 14 digits
            "0000000000001000/room/6c6f626279", // 16 digits
            "00000000000100a/room/6c6f626279",  // non-digit due
            "000000000001000/room/6C6F626279",  // uppercase hex
            "000000000001000/room/6c6f62627",   // odd hex
            "000000000001000/room/zz",          // non-hex
            "000000000001000/room/",            // empty name
            "000000000001000/ro.om/6c6f626279", // dot in class
            "000000000001000//6c6f626279",      // empty class
            "000000000001000/ro om/6c6f626279", // space in class
            "000000000001000/room/6c6f626279/00000000000000000003-00000000000000ff", // tag outside .t
            "000000000001000/room.t/6c6f626279", // .t without tag
            "000000000001000/ro.om.t/6c6f626279/00000000000000000003-00000000000000ff", // dot in tagged class
            "000000000001000/room.t/6c6f626279/0000000000000000003-00000000000000ff", // 19-digit generation
            "000000000001000/room.t/6c6f626279/99999999999999999999-00000000000000ff", // generation overflow
            "000000000001000/room.t/6c6f626279/00000000000000000003-000000000000ff", // short nonce
            "000000000001000/room.t/6c6f626279/00000000000000000003-00000000000000FF", // uppercase nonce
            "000000000001000/room.t/6c6f626279/00000000000000000003_00000000000000ff", // separator
            "000000000001000/room.t/6c6f626279/00000000000000000003-00000000000000ff/x", // extra segment
            "000000000001000/room/6c6f626279/", // trailing slash
            "000000000001000/room/ff",          // not utf-8
        ] {
            assert!(IndexKey::parse(bad).is_err(), "accepted {bad:?}");
        }
        for bad in ["1000", "000000000001000/", "000000000001000/3-ff", "x"] {
            assert!(Entry::parse_meta(bad).is_err(), "accepted meta {bad:?}");
        }
        assert!(IndexKey::parse_full("alarms/t/", &format!("alarms/u/{good_legacy}")).is_err());
        assert!(IndexKey::new(addr(), Entry::legacy(DUE_MAX_MS + 1)).is_err());
        assert!(Address::new("a.b", "x").is_err());
        assert!(Address::new("a", "").is_err());
        assert!(Address::new("a", "x".repeat(NAME_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn randomly_mutated_keys_never_parse_to_a_different_spelling() {
        // Whatever a mutation produces, if it parses, it must format back to
        // itself: each entry has exactly one key.
        let mut rng = Rng(3);
        for _ in 0..20_000 {
            let mut bytes = random_key(&mut rng).to_key().into_bytes();
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] = b"0aA/.-tf9 "[rng.below(10) as usize];
            if let Ok(text) = String::from_utf8(bytes)
                && let Ok(k) = IndexKey::parse(&text)
            {
                assert_eq!(k.to_key(), text);
            }
        }
    }

    #[test]
    fn r1_every_changed_alarm_gets_a_fresh_create_only_key() {
        let a = addr();
        let before = Entry::tagged(1_000, 1, 9);
        let p = plan_event(Rules::SAFE, &a, Some(&before), Some(2_000), 2, 10).unwrap();
        let put = p.put_before_upload.unwrap();
        assert!(put.create_only);
        assert_eq!(put.key.entry, Entry::tagged(2_000, 2, 10));
        assert_eq!(p.record, Some(put.key.entry));
        assert_eq!(p.delete_after_upload.unwrap().entry, before);
        // Back to the first time: a new key, never the old one again.
        let p2 = plan_event(Rules::SAFE, &a, Some(&put.key.entry), Some(1_000), 2, 11).unwrap();
        assert_ne!(p2.put_before_upload.unwrap().key.entry, before);
        // The unsafe variant reuses the key: this is what R1 forbids.
        let u = plan_event(
            Rules::with(Variant::UntaggedKeys),
            &a,
            None,
            Some(1_000),
            2,
            12,
        )
        .unwrap();
        let u2 = plan_event(
            Rules::with(Variant::UntaggedKeys),
            &a,
            Some(&Entry::legacy(2_000)),
            Some(1_000),
            3,
            13,
        )
        .unwrap();
        assert_eq!(
            u.put_before_upload.unwrap().key,
            u2.put_before_upload.unwrap().key
        );
    }

    #[test]
    fn an_unchanged_alarm_keeps_its_entry_and_legacy_entries_migrate() {
        let a = addr();
        let other_owner = Entry::tagged(1_000, 1, 9);
        let p = plan_event(Rules::SAFE, &a, Some(&other_owner), Some(1_000), 5, 10).unwrap();
        assert_eq!(
            p,
            EventPlan {
                put_before_upload: None,
                record: Some(other_owner),
                delete_after_upload: None
            }
        );
        let legacy = Entry::legacy(1_000);
        let m = plan_event(Rules::SAFE, &a, Some(&legacy), Some(1_000), 5, 10).unwrap();
        assert_eq!(
            m.put_before_upload.unwrap().key.entry,
            Entry::tagged(1_000, 5, 10)
        );
        assert_eq!(m.delete_after_upload.unwrap().entry, legacy);
        let c = plan_event(Rules::SAFE, &a, Some(&other_owner), None, 5, 10).unwrap();
        assert_eq!(c.record, None);
        assert_eq!(c.put_before_upload, None);
        assert_eq!(c.delete_after_upload.unwrap().entry, other_owner);
    }

    #[test]
    fn r2_stale_cleanup_spares_the_named_entry() {
        let a = addr();
        let named = Entry::tagged(1_000, 2, 1);
        let listed = vec![
            IndexKey::new(a.clone(), named).unwrap().to_key(),
            IndexKey::new(a.clone(), Entry::tagged(1_000, 1, 7))
                .unwrap()
                .to_key(),
            IndexKey::new(a.clone(), Entry::tagged(2_000, 1, 7))
                .unwrap()
                .to_key(), // another time
            IndexKey::new(
                Address::new("room", "other").unwrap(),
                Entry::tagged(1_000, 1, 8),
            )
            .unwrap()
            .to_key(),
            "garbage".to_owned(),
        ];
        let del = stale_entries_to_delete(Rules::SAFE, &a, 1_000, &listed, Some(&named), 2);
        let entries: Vec<Entry> = del.iter().map(|k| k.entry).collect();
        assert_eq!(
            entries,
            vec![Entry::legacy(1_000), Entry::tagged(1_000, 1, 7)]
        );
        // A named legacy entry is spared too.
        let del =
            stale_entries_to_delete(Rules::SAFE, &a, 1_000, &[], Some(&Entry::legacy(1_000)), 2);
        assert!(del.is_empty());
    }

    #[test]
    fn r3_never_deletes_a_higher_generation() {
        let a = addr();
        let newer = IndexKey::new(a.clone(), Entry::tagged(1_000, 4, 1))
            .unwrap()
            .to_key();
        let del = stale_entries_to_delete(
            Rules::SAFE,
            &a,
            1_000,
            std::slice::from_ref(&newer),
            None,
            3,
        );
        assert!(del.iter().all(|k| k.entry.generation() <= 3));
        let unsafe_del = stale_entries_to_delete(
            Rules::with(Variant::NoGenerationCheck),
            &a,
            1_000,
            &[newer],
            None,
            3,
        );
        assert!(unsafe_del.iter().any(|k| k.entry.generation() == 4));
    }

    #[test]
    fn r2_fence_before_removing_and_nothing_removed_on_an_empty_bucket() {
        let cfg = ClusterConfig::default();
        let committed = AlarmState {
            at_ms: Some(5_000),
            indexed: Some(Entry::tagged(5_000, 1, 1)),
            retry_count: 0,
        };
        let mut ctx = StaleContext {
            delivered_at_ms: 1_000,
            committed: &committed,
            bucket_had_state: true,
            uploaded_since_take: false,
        };
        assert_eq!(
            next_stale_step(Rules::SAFE, &ctx, &cfg, 0),
            StaleStep::Fence
        );
        assert_eq!(
            next_stale_step(Rules::with(Variant::NoFence), &ctx, &cfg, 0),
            StaleStep::ListAndDelete
        );
        ctx.uploaded_since_take = true;
        assert_eq!(
            next_stale_step(Rules::SAFE, &ctx, &cfg, 0),
            StaleStep::ListAndDelete
        );

        let empty = AlarmState::default();
        let ctx = StaleContext {
            delivered_at_ms: 1_000,
            committed: &empty,
            bucket_had_state: false,
            uploaded_since_take: false,
        };
        assert_eq!(
            next_stale_step(Rules::SAFE, &ctx, &cfg, 7),
            StaleStep::LeaveAndRelease {
                retry_at_ms: 7 + cfg.retry_max_ms
            }
        );
        assert_eq!(
            next_stale_step(Rules::with(Variant::ClearOnEmptyBucket), &ctx, &cfg, 7),
            StaleStep::ListAndDelete
        );

        let legacy = AlarmState {
            at_ms: Some(5_000),
            indexed: Some(Entry::legacy(5_000)),
            retry_count: 0,
        };
        let ctx = StaleContext {
            delivered_at_ms: 1_000,
            committed: &legacy,
            bucket_had_state: true,
            uploaded_since_take: false,
        };
        assert_eq!(
            next_stale_step(Rules::SAFE, &ctx, &cfg, 0),
            StaleStep::IndexCommitted
        );
    }

    #[test]
    fn r4_the_entry_goes_before_the_first_upload() {
        let a = addr();
        let p = plan_first_upload(Rules::SAFE, &a, Some(9_000), 1, 5).unwrap();
        assert_eq!(
            p.put_before_upload.as_ref().unwrap().key.entry,
            Entry::tagged(9_000, 1, 5)
        );
        assert_eq!(p.record, Some(Entry::tagged(9_000, 1, 5)));
        assert!(p.put_after_upload.is_none());
        let u = plan_first_upload(
            Rules::with(Variant::UploadBeforeEntry),
            &a,
            Some(9_000),
            1,
            5,
        )
        .unwrap();
        assert!(u.put_before_upload.is_none() && u.put_after_upload.is_some());
        let none = plan_first_upload(Rules::SAFE, &a, None, 1, 5).unwrap();
        assert_eq!(none.record, None);
    }

    #[test]
    fn delivery_runs_only_a_due_matching_alarm() {
        assert_eq!(plan_delivery(1_000, Some(1_000), 1_000), Delivery::Run);
        assert_eq!(
            plan_delivery(1_000, Some(1_000), 999),
            Delivery::NotDue { at_ms: 1_000 }
        );
        assert_eq!(plan_delivery(1_000, Some(2_000), 5_000), Delivery::Stale);
        assert_eq!(plan_delivery(1_000, None, 5_000), Delivery::Stale);
    }
}
