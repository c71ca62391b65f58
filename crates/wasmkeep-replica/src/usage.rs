//! What one tenant holds in the bucket: its bytes and its actors, for the
//! tenant's bucket quota (issue 33).
//!
//! A measurement lists everything under `state/<tenant>/` once, as the
//! store pages it, summing sizes and counting actor folders, and holds
//! nothing but the running totals and the folder of the last key: an
//! actor's keys come one after another in a listing (S3 lists in key
//! order, a local folder depth first), so counting changes of folder
//! counts the actors. The alarm index's entries under the tenant's apps
//! count in its bytes, not as actors.
//!
//! In a cluster one node measures a tenant and publishes the figures at
//! [`usage_key`] for the others to read ([`Measured::encode`], a line of
//! text with no JSON, since this crate speaks none).

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use crate::bucket::Bucket;
use crate::error::ReplicaError;

/// Most bytes a published measurement may have (`usage_bytes_max`): it is
/// a line of three numbers.
pub const USAGE_OBJECT_BYTES_MAX: u64 = 256;

/// The folders under an actor's root: what follows the root in its keys.
const ACTOR_FOLDERS: [&str; 5] = ["/log/", "/snap/", "/delta/", "/whole/", "/hold/"];

/// One tenant's bytes and actors in the bucket, as measured at `at_ms`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    pub bytes: u64,
    pub actors: u64,
    pub at_ms: u64,
}

impl Measured {
    /// `v1 <bytes> <actors> <at_ms>`.
    pub fn encode(&self) -> Bytes {
        Bytes::from(format!(
            "v1 {} {} {}\n",
            self.bytes, self.actors, self.at_ms
        ))
    }

    /// What [`Measured::encode`] wrote; `None` for anything else.
    pub fn decode(body: &[u8]) -> Option<Measured> {
        let text = std::str::from_utf8(body).ok()?;
        let mut parts = text.trim_end_matches('\n').split(' ');
        if parts.next()? != "v1" {
            return None;
        }
        let mut number = || parts.next()?.parse::<u64>().ok();
        let m = Measured {
            bytes: number()?,
            actors: number()?,
            at_ms: number()?,
        };
        parts.next().is_none().then_some(m)
    }
}

/// Where a tenant's measurement is published, relative to the bucket's
/// prefix. Tenants are identifiers, so the key needs no escaping.
pub fn usage_key(tenant: &str) -> String {
    format!("usage/{tenant}")
}

/// The actor folder a key of `state/<tenant>/` is in, if it is in one.
/// The folder's name is searched for only after `state/<tenant>/<app>/
/// <class>/`: a tenant may name an app or class `log` or `snap`, but an
/// actor's encoded name holds only hex digits, `+` and `/`.
fn actor_folder(key: &str) -> Option<&str> {
    let (name_at, _) = key.match_indices('/').nth(3)?;
    ACTOR_FOLDERS
        .iter()
        .filter_map(|f| key[name_at..].find(f))
        .min()
        .map(|i| &key[..name_at + i])
}

/// Lists `state/<tenant>/` once and sums it. Stops (with what it counted
/// so far, `Ok(None)`) when `stop` is set.
pub async fn measure_tenant(
    bucket: &Bucket,
    tenant: &str,
    at_ms: u64,
    stop: &AtomicBool,
) -> Result<Option<Measured>, ReplicaError> {
    wasmkeep_store::id::validate_segment("tenant", tenant).map_err(ReplicaError::InvalidName)?;
    let mut m = Measured {
        at_ms,
        ..Measured::default()
    };
    let mut last: Option<String> = None;
    let mut stopped = false;
    bucket
        .sum_under(&format!("state/{tenant}/"), |key, size| {
            if stop.load(Ordering::Relaxed) {
                stopped = true;
                return false;
            }
            m.bytes = m.bytes.saturating_add(size);
            if let Some(folder) = actor_folder(key)
                && last.as_deref() != Some(folder)
            {
                m.actors += 1;
                last = Some(folder.to_owned());
            }
            true
        })
        .await?;
    Ok((!stopped).then_some(m))
}

/// Publishes a measurement for the tenant's other nodes.
pub async fn publish(bucket: &Bucket, tenant: &str, m: &Measured) -> Result<(), ReplicaError> {
    bucket.overwrite(&usage_key(tenant), m.encode()).await
}

/// The measurement another node published; `None` when there is none or
/// it is not one.
pub async fn read_published(
    bucket: &Bucket,
    tenant: &str,
) -> Result<Option<Measured>, ReplicaError> {
    match bucket
        .get_bounded(
            &usage_key(tenant),
            "usage_bytes_max",
            USAGE_OBJECT_BYTES_MAX,
        )
        .await
    {
        Ok(body) => Ok(Measured::decode(&body)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_reads_back_and_junk_does_not() {
        let m = Measured {
            bytes: 10,
            actors: 2,
            at_ms: 3,
        };
        assert_eq!(Measured::decode(&m.encode()), Some(m));
        for junk in [
            &b""[..],
            b"v1 1 2",
            b"v1 1 2 3 4",
            b"v2 1 2 3",
            b"v1 -1 2 3",
            b"\xff",
        ] {
            assert_eq!(Measured::decode(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn keys_are_counted_in_their_actors_folder() {
        let k = "state/t/app/counter/6161/log/00000000000000000001";
        assert_eq!(actor_folder(k), Some("state/t/app/counter/6161"));
        let long = "state/t/app/c/aaaa+/bbbb/snap/00000000000000000002";
        assert_eq!(actor_folder(long), Some("state/t/app/c/aaaa+/bbbb"));
        assert_eq!(actor_folder("state/t/app/alarms/123/x"), None);
        // Apps and classes named like an actor's folders are not taken
        // for one (all of app `log`'s actors would count as one).
        let named = "state/t/log/snap/6161/log/00000000000000000001";
        assert_eq!(actor_folder(named), Some("state/t/log/snap/6161"));
    }

    #[tokio::test]
    async fn a_tenants_bytes_and_actors_are_summed_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = Bucket::from_url(&format!("file://{}", dir.path().display())).unwrap();
        for (key, len) in [
            ("state/t/a/c/61/log/00000000000000000001", 100),
            ("state/t/a/c/61/log/00000000000000000002", 50),
            ("state/t/a/c/61/snap/00000000000000000002", 300),
            ("state/t/a/c/62/log/00000000000000000001", 7),
            ("state/t/a/c/62/hold/00000000000000000001", 3),
            ("state/t2/a/c/61/log/00000000000000000001", 1000),
        ] {
            bucket
                .overwrite(key, Bytes::from(vec![0u8; len]))
                .await
                .unwrap();
        }
        let stop = AtomicBool::new(false);
        let m = measure_tenant(&bucket, "t", 9, &stop)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((m.bytes, m.actors, m.at_ms), (460, 2, 9));
        publish(&bucket, "t", &m).await.unwrap();
        assert_eq!(read_published(&bucket, "t").await.unwrap(), Some(m));
        assert_eq!(read_published(&bucket, "t2").await.unwrap(), None);
        stop.store(true, Ordering::Relaxed);
        assert_eq!(measure_tenant(&bucket, "t", 9, &stop).await.unwrap(), None);
    }
}
