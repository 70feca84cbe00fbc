//! The keys this process charged what its fleet presumed after an outage (invariant 19,
//! [`crate::algorithm::fleet`]), and the charge's debit id. The charge itself, before a key's next store call,
//! is `presumed_mode.rs`.

use dashmap::DashMap;

/// The keys this process charged a presumption to: the presumption's epoch, and when the charge stops mattering
/// (ms of the limiter's clock). At most `max_keys` of them; a key not remembered is charged again, which the
/// store applies once.
#[derive(Debug)]
pub(crate) struct Charged {
    map: DashMap<String, (u64, u64), foldhash::fast::RandomState>,
    max_keys: usize,
}

impl Charged {
    /// Remembering at most `max_keys` keys.
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: DashMap::default(),
            max_keys,
        }
    }

    pub(crate) fn charged(&self, key: &str, epoch: u64) -> bool {
        self.map.get(key).is_some_and(|e| e.0 >= epoch)
    }

    pub(crate) fn record(&self, key: &str, epoch: u64, until_ms: u64) {
        if self.map.len() < self.max_keys || self.map.contains_key(key) {
            self.map.insert(key.to_owned(), (epoch, until_ms));
        }
    }

    /// Forgets the keys whose charge stopped mattering by `now_ms`.
    pub(crate) fn sweep(&self, now_ms: u64) {
        self.map.retain(|_, (_, until)| *until > now_ms);
    }
}

/// The debit's id of the presumption of the hold `epoch`: the same in every process.
pub(crate) fn debit_id(epoch: u64) -> String {
    format!("fleet.{epoch}")
}
