//! The switch between ADR 0009's rules and the unsafe variants the simulator
//! uses to show that each rule is needed.
//!
//! The variants live here, in the code the server runs, behind a value passed
//! in at run time: removing a rule in the simulator removes it from the same
//! functions, so a simulation that catches the variant shows the rule matters.

/// Which rules the owner follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// ADR 0009 as written: the only variant a server may run.
    #[default]
    Safe,
    /// Breaks R1: entries are written under the untagged (legacy) key, so the
    /// same key is written again when an alarm returns to a time.
    UntaggedKeys,
    /// Breaks R3: stale entries are deleted whatever generation wrote them.
    NoGenerationCheck,
    /// Breaks R2's fence: an owner that has uploaded nothing yet removes stale
    /// entries without first uploading `owner_fence`.
    NoFence,
    /// Breaks R4: a joining node uploads its first snapshot before it lists the
    /// alarm that snapshot names.
    UploadBeforeEntry,
    /// Breaks R2's empty-bucket clause: an owner that found nothing in the
    /// bucket for the actor removes stale entries anyway.
    ClearOnEmptyBucket,
    /// Breaks the sweep's no-state rule: an entry delivered for an actor with
    /// no state (no committed alarm and no `on-init` recorded: deleted since,
    /// or never initialised) runs `on-alarm` anyway, which creates the actor
    /// again (a deleted actor comes back).
    RunWithoutState,
}

impl Variant {
    /// Every unsafe variant, in the order the ADR lists them.
    pub const UNSAFE: [Variant; 6] = [
        Variant::UntaggedKeys,
        Variant::NoGenerationCheck,
        Variant::NoFence,
        Variant::UploadBeforeEntry,
        Variant::ClearOnEmptyBucket,
        Variant::RunWithoutState,
    ];

    /// The variant's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Safe => "safe",
            Variant::UntaggedKeys => "untagged-keys",
            Variant::NoGenerationCheck => "no-generation-check",
            Variant::NoFence => "no-fence",
            Variant::UploadBeforeEntry => "upload-before-entry",
            Variant::ClearOnEmptyBucket => "clear-on-empty-bucket",
            Variant::RunWithoutState => "run-without-state",
        }
    }

    /// Parses a name given by [`Variant::name`].
    pub fn parse(name: &str) -> Option<Variant> {
        std::iter::once(Variant::Safe)
            .chain(Variant::UNSAFE)
            .find(|v| v.name() == name)
    }
}

/// The rules an owner applies; the server uses [`Rules::SAFE`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Which variant of the rules is in force.
    pub variant: Variant,
}

impl Rules {
    /// ADR 0009's rules.
    pub const SAFE: Rules = Rules {
        variant: Variant::Safe,
    };

    /// Rules with one variant in force.
    pub fn with(variant: Variant) -> Rules {
        Rules { variant }
    }

    /// R1: every PUT uses a fresh, tagged key.
    pub fn tagged_keys(self) -> bool {
        self.variant != Variant::UntaggedKeys
    }

    /// R3: entries with a generation above the owner's are never deleted.
    pub fn generation_check(self) -> bool {
        self.variant != Variant::NoGenerationCheck
    }

    /// R2: an owner that has uploaded nothing yet uploads `owner_fence` before
    /// it removes stale entries.
    pub fn owner_fence(self) -> bool {
        self.variant != Variant::NoFence
    }

    /// R4: a joining node lists its alarm before its first upload.
    pub fn entry_before_first_upload(self) -> bool {
        self.variant != Variant::UploadBeforeEntry
    }

    /// R2: an owner that found nothing in the bucket removes nothing.
    pub fn keep_on_empty_bucket(self) -> bool {
        self.variant != Variant::ClearOnEmptyBucket
    }

    /// The sweep's no-state rule: an entry delivered for an actor with no
    /// state is removed without running the actor
    /// ([`crate::delivery::plan_delivery`]).
    pub fn skip_without_state(self) -> bool {
        self.variant != Variant::RunWithoutState
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_only_safe_keeps_every_rule() {
        for v in std::iter::once(Variant::Safe).chain(Variant::UNSAFE) {
            assert_eq!(Variant::parse(v.name()), Some(v));
            let r = Rules::with(v);
            let kept = [
                r.tagged_keys(),
                r.generation_check(),
                r.owner_fence(),
                r.entry_before_first_upload(),
                r.keep_on_empty_bucket(),
                r.skip_without_state(),
            ];
            let broken = kept.iter().filter(|k| !**k).count();
            assert_eq!(broken, usize::from(v != Variant::Safe), "{v:?}");
        }
        assert_eq!(Variant::parse("unsafe"), None);
        assert_eq!(Rules::default(), Rules::SAFE);
    }
}
