//! A switch that holds the engine's probes. Only the hidden
//! `--bench-routes` flag makes one: `make bench-scale` measures the lease
//! API with the probes paused and running in one process, so the two
//! figures differ by the probes alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Shared by the engine (reads it before each dispatch) and the bench
/// route that flips it.
#[derive(Clone, Debug, Default)]
pub struct Pause(Arc<AtomicBool>);

impl Pause {
    /// Holds (true) or resumes (false) the probes.
    pub fn set(&self, paused: bool) {
        self.0.store(paused, Ordering::Relaxed);
    }

    pub fn is_paused(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
