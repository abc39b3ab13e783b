//! What a provider's observation holds (a Pod store, the newest listing),
//! kept only while the stream that fills it runs: each start of the
//! observation replaces what an earlier one held, and a start whose stream
//! is dropped takes its value with it, so a stopped observation never
//! answers from a stale picture.

use std::sync::{Arc, Mutex, MutexGuard};

struct State<T> {
    started: u64,
    value: Option<T>,
}

/// The value of the running observation, if any.
pub struct Slot<T> {
    state: Arc<Mutex<State<T>>>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            state: Arc::new(Mutex::new(State {
                started: 0,
                value: None,
            })),
        }
    }
}

fn lock<T>(state: &Mutex<State<T>>) -> MutexGuard<'_, State<T>> {
    // Only ever replaced whole: a poisoned slot is still valid.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Clone> Slot<T> {
    /// The value the running observation holds.
    pub fn get(&self) -> Option<T> {
        lock(&self.state).value.clone()
    }

    /// Starts an observation holding `value` (or nothing yet), in place of
    /// any earlier one; its value goes when the returned [`Run`] is dropped.
    pub fn start(&self, value: Option<T>) -> Run<T> {
        let mut s = lock(&self.state);
        s.started += 1;
        s.value = value;
        Run {
            state: self.state.clone(),
            started: s.started,
        }
    }
}

/// One start of an observation; hold it as long as its stream runs.
pub struct Run<T> {
    state: Arc<Mutex<State<T>>>,
    started: u64,
}

impl<T> Run<T> {
    /// Replaces the value, returning the one before; `None` once a later
    /// start has taken over (this run should end).
    pub fn set(&self, value: T) -> Option<Option<T>> {
        let mut s = lock(&self.state);
        (s.started == self.started).then(|| s.value.replace(value))
    }
}

impl<T> Drop for Run<T> {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        if s.started == self.started {
            s.value = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_lives_as_long_as_its_run_and_no_longer() {
        let slot = Slot::<u32>::default();
        assert_eq!(slot.get(), None);
        let first = slot.start(Some(1));
        assert_eq!(slot.get(), Some(1));
        assert_eq!(first.set(2), Some(Some(1)));
        let second = slot.start(None);
        assert_eq!(slot.get(), None, "a new start drops the old value");
        assert_eq!(first.set(3), None, "a superseded run writes nothing");
        assert_eq!(second.set(4), Some(None));
        drop(first);
        assert_eq!(
            slot.get(),
            Some(4),
            "an old run ending leaves the new value"
        );
        drop(second);
        assert_eq!(slot.get(), None, "its own run ending drops it");
    }
}
