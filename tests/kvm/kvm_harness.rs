//! The harness itself: a step of its own that fails (here its temp dir,
//! under a root that does not exist) fails the test with the step and the
//! reason, instead of returning early and passing having tested nothing.

use std::path::Path;

use crate::kvm_support::Env;

#[test]
#[should_panic(expected = "the kvm harness could not make its temp dir in /nonexistent/epo-kvm")]
fn a_failed_harness_step_fails_the_test_with_its_reason() {
    let _env = Env::start_in("hx", Path::new("/nonexistent/epo-kvm"));
}
