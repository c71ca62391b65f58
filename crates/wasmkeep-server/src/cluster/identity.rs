//! The node's identity in its data directory: a node id generated once, and
//! an epoch taken anew at every start (ADR 0020).
//!
//! ```text
//! <data>/node/id      the node id (32 lowercase hex digits, or the
//!                     configured `cluster_node_id`) and a newline
//! <data>/node/epoch   the last epoch this node took: decimal and a newline
//! ```
//!
//! An epoch must exceed every epoch the node used before, or two starts of one
//! node would write the same lease keys. So the next epoch is written and
//! made durable (file fsynced, renamed over the old one, folder fsynced)
//! before the node registers a lease in it. The epoch file is written before
//! the id on a first start: a start that dies between the two leaves an epoch
//! without an id, and the next start makes a new node (safe), never an id
//! without its epoch (which would reuse epochs). A file that does not parse,
//! or an id whose epoch file is gone, stops the start with an error naming
//! the file: guessing would risk reusing an epoch.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::ClusterError;

/// The folder of the identity files, below the data directory.
pub const NODE_DIR: &str = "node";

/// A node's id and its current epoch, as persisted.
#[derive(Debug)]
pub struct NodeIdentity {
    dir: PathBuf,
    node: String,
    epoch: u64,
}

impl NodeIdentity {
    /// Loads the node id (creating it on a first start) and takes the next
    /// epoch, durably, before returning. `configured`: the operator's
    /// `cluster_node_id`, which a first start takes instead of a random id
    /// (a data directory that names another id stops the start);
    /// `registered`: the newest epoch the bucket has registered for it,
    /// which a first start goes past (ADR 0069).
    pub fn start(
        data: &Path,
        configured: Option<&str>,
        registered: u64,
    ) -> Result<NodeIdentity, ClusterError> {
        let dir = data.join(NODE_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let id_path = dir.join("id");
        let epoch_path = dir.join("epoch");
        let last = read_optional(&epoch_path)?
            .map(|text| parse_epoch(&epoch_path, &text))
            .transpose()?;
        let (node, epoch) = match read_optional(&id_path)? {
            Some(text) => {
                let node = parse_id(&id_path, &text)?;
                if let Some(c) = configured
                    && c != node
                {
                    return Err(corrupt(
                        &id_path,
                        &format!(
                            "names node {node}, not the configured cluster_node_id {c} (set cluster_node_id = \"{node}\", or remove the folder {NODE_DIR}/ to make this node {c})"
                        ),
                    ));
                }
                let Some(last) = last else {
                    return Err(corrupt(
                        &epoch_path,
                        "missing while the node id exists: the node's epochs are unknown",
                    ));
                };
                (node, last.max(registered))
            }
            None => {
                let node = match configured {
                    Some(c) => c.to_owned(),
                    None => super::random_hex(16)?,
                };
                // A configured id may have run on a disk since lost: its
                // epochs go on after those the bucket registered.
                let floor = last.unwrap_or(0).max(registered);
                write_durably(&dir, &epoch_path, &format!("{floor}\n"))?;
                write_durably(&dir, &id_path, &format!("{node}\n"))?;
                (node, floor)
            }
        };
        let mut me = NodeIdentity { dir, node, epoch };
        me.next_epoch()?;
        Ok(me)
    }

    /// An empty identity, held only while the real one is away on a
    /// blocking thread taking the next epoch.
    pub(super) fn placeholder() -> NodeIdentity {
        NodeIdentity {
            dir: PathBuf::new(),
            node: String::new(),
            epoch: 0,
        }
    }

    /// The node id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Takes the next epoch, durably, and returns it: after a lapse or a
    /// fence, before the node registers again.
    pub fn next_epoch(&mut self) -> Result<u64, ClusterError> {
        let next = self
            .epoch
            .checked_add(1)
            .ok_or_else(|| corrupt(&self.dir.join("epoch"), "epoch at its maximum"))?;
        write_durably(&self.dir, &self.dir.join("epoch"), &format!("{next}\n"))?;
        self.epoch = next;
        Ok(next)
    }
}

fn io(path: &Path, e: std::io::Error) -> ClusterError {
    ClusterError::Identity {
        reason: e.to_string(),
        path: path.to_owned(),
    }
}

fn corrupt(path: &Path, reason: &str) -> ClusterError {
    ClusterError::Identity {
        reason: reason.to_owned(),
        path: path.to_owned(),
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, ClusterError> {
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() > 64 => Err(corrupt(path, "longer than 64 bytes")),
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| corrupt(path, "not utf-8")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path, e)),
    }
}

fn parse_id(path: &Path, text: &str) -> Result<String, ClusterError> {
    let id = text.strip_suffix('\n').unwrap_or(text);
    wasmkeep_cluster::lease::validate_node(id)
        .map_err(|_| corrupt(path, "not a node id (lowercase letters, digits, `-`)"))?;
    Ok(id.to_owned())
}

fn parse_epoch(path: &Path, text: &str) -> Result<u64, ClusterError> {
    let digits = text.strip_suffix('\n').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(corrupt(path, "not a decimal epoch"));
    }
    digits
        .parse()
        .map_err(|_| corrupt(path, "epoch out of range"))
}

/// Writes `path` through a temporary file: fsynced, renamed over, and the
/// folder fsynced, so that after a crash the file holds the old or the new
/// text, and the new one once this returns.
fn write_durably(dir: &Path, path: &Path, text: &str) -> Result<(), ClusterError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    f.write_all(text.as_bytes()).map_err(|e| io(&tmp, e))?;
    f.sync_all().map_err(|e| io(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_stays_and_every_start_takes_a_new_epoch() {
        let data = tempfile::tempdir().unwrap();
        let mut a = NodeIdentity::start(data.path(), None, 0).unwrap();
        assert_eq!(a.epoch(), 1);
        assert_eq!(a.node().len(), 32);
        assert_eq!(a.next_epoch().unwrap(), 2);
        let b = NodeIdentity::start(data.path(), None, 0).unwrap();
        assert_eq!((b.node(), b.epoch()), (a.node(), 3));
        let on_disk = std::fs::read_to_string(data.path().join("node/epoch")).unwrap();
        assert_eq!(on_disk, "3\n");
    }

    #[test]
    fn corrupt_files_stop_the_start_naming_the_file() {
        let data = tempfile::tempdir().unwrap();
        NodeIdentity::start(data.path(), None, 0).unwrap();
        let epoch = data.path().join("node/epoch");
        let id = data.path().join("node/id");
        for (path, text) in [(&epoch, "x\n"), (&epoch, ""), (&id, "Not An Id\n")] {
            let keep = std::fs::read(path).unwrap();
            std::fs::write(path, text).unwrap();
            let e = NodeIdentity::start(data.path(), None, 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&path.display().to_string()), "{e}");
            std::fs::write(path, keep).unwrap();
        }
        // An id without its epoch file: the epochs it used are unknown.
        std::fs::remove_file(&epoch).unwrap();
        let e = NodeIdentity::start(data.path(), None, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("epoch") && e.contains("missing"), "{e}");
        // An epoch without an id (a first start that died between the two
        // writes) makes a new node, continuing the epochs.
        std::fs::write(&epoch, "7\n").unwrap();
        std::fs::remove_file(&id).unwrap();
        let n = NodeIdentity::start(data.path(), None, 0).unwrap();
        assert_eq!(n.epoch(), 8);
    }

    /// A configured id on a data directory without an identity (its disk
    /// was lost) goes on past the epochs the bucket registered for it; a
    /// directory that names another id stops the start.
    #[test]
    fn a_configured_id_survives_a_lost_disk_in_a_later_epoch() {
        let data = tempfile::tempdir().unwrap();
        let a = NodeIdentity::start(data.path(), Some("node-a"), 41).unwrap();
        assert_eq!((a.node(), a.epoch()), ("node-a", 42));
        let b = NodeIdentity::start(data.path(), Some("node-a"), 0).unwrap();
        assert_eq!(b.epoch(), 43, "the directory's own epoch counts");
        let e = NodeIdentity::start(data.path(), Some("node-b"), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node-a") && e.contains("node-b"), "{e}");
        // The bucket's epochs count even where the directory has the id
        // (a directory restored from an older copy).
        let c = NodeIdentity::start(data.path(), Some("node-a"), 50).unwrap();
        assert_eq!(c.epoch(), 51);
        // A fresh directory without a configured id starts at 1.
        let fresh = tempfile::tempdir().unwrap();
        assert_eq!(
            NodeIdentity::start(fresh.path(), None, 0).unwrap().epoch(),
            1
        );
    }
}
