//! What the agent knows about a Pod's containers, and the PodStatus it
//! reports: phase, conditions, container statuses.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A container's state.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: Option<String>,
        started_at: Timestamp,
        finished_at: Timestamp,
    },
}

impl State {
    pub fn waiting(reason: &str, message: Option<String>) -> State {
        State::Waiting {
            reason: reason.to_string(),
            message,
        }
    }

    fn to_api(&self) -> ContainerState {
        match self {
            State::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            State::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            State::Terminated {
                exit_code,
                reason,
                message,
                started_at,
                finished_at,
            } => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: *exit_code,
                    reason: Some(reason.clone()),
                    message: message.clone(),
                    started_at: Some(Time(*started_at)),
                    finished_at: Some(Time(*finished_at)),
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }
}

/// What the agent knows about one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRecord {
    pub name: String,
    pub image: String,
    pub state: State,
    /// The previous termination (shown as `lastState`).
    pub last_state: Option<State>,
    pub ready: bool,
    pub started: bool,
    pub restart_count: i32,
    pub container_id: Option<String>,
    /// An init container with `restartPolicy: Always` (a sidecar).
    pub sidecar: bool,
}

impl ContainerRecord {
    pub fn new(name: &str, image: &str) -> ContainerRecord {
        ContainerRecord {
            name: name.to_string(),
            image: image.to_string(),
            state: State::waiting("ContainerCreating", None),
            last_state: None,
            ready: false,
            started: false,
            restart_count: 0,
            container_id: None,
            sidecar: false,
        }
    }

    fn to_api(&self) -> ContainerStatus {
        let running = matches!(self.state, State::Running { .. });
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: format!("testcluster://{}", super::image::repository(&self.image)),
            container_id: self.container_id.clone(),
            ready: self.ready,
            started: Some(self.started && running),
            restart_count: self.restart_count,
            state: Some(self.state.to_api()),
            last_state: Some(
                self.last_state
                    .as_ref()
                    .map(State::to_api)
                    .unwrap_or_default(),
            ),
            ..Default::default()
        }
    }

    fn succeeded(&self) -> bool {
        matches!(self.state, State::Terminated { exit_code: 0, .. })
    }
}

/// What the agent knows about a Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    pub init: Vec<ContainerRecord>,
    pub containers: Vec<ContainerRecord>,
    pub pod_ip: Option<Ipv4Addr>,
    pub host_ip: Ipv4Addr,
    pub start_time: Timestamp,
    pub sandbox_ready: bool,
    /// Set once the Pod failed for good (an init container failed under
    /// `restartPolicy: Never`).
    pub init_failed: bool,
}

/// Kubernetes' phase rules (kubelet's `getPhase`).
pub fn phase(rec: &PodRecord, restart_policy: &str) -> &'static str {
    if rec.init_failed {
        return "Failed";
    }
    let init_pending = rec.init.iter().any(|c| !c.sidecar && !c.succeeded());
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &rec.containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated { exit_code, .. } => {
                stopped += 1;
                if *exit_code == 0 {
                    succeeded += 1;
                }
            }
            State::Waiting { .. } if c.last_state.is_some() => stopped += 1,
            State::Waiting { .. } => waiting += 1,
        }
    }
    if init_pending || waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        if restart_policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if restart_policy == "Never" {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

/// When each condition last changed.
pub type Transitions = BTreeMap<String, (String, Timestamp)>;

fn condition(
    transitions: &mut Transitions,
    now: Timestamp,
    type_: &str,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let entry = transitions
        .entry(type_.to_string())
        .or_insert_with(|| (status.to_string(), now));
    if entry.0 != status {
        *entry = (status.to_string(), now);
    }
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        last_transition_time: Some(Time(entry.1)),
        reason: if ok { None } else { reason },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

fn names(list: &[&ContainerRecord]) -> String {
    let n: Vec<&str> = list.iter().map(|c| c.name.as_str()).collect();
    format!("[{}]", n.join(" "))
}

/// The status to report. `scheduled` is the scheduler's PodScheduled
/// condition, kept as it is.
pub fn build(
    rec: &PodRecord,
    restart_policy: &str,
    scheduled: Option<PodCondition>,
    transitions: &mut Transitions,
    now: Timestamp,
) -> PodStatus {
    let phase = phase(rec, restart_policy);
    let terminal = phase == "Succeeded" || phase == "Failed";
    let incomplete: Vec<&ContainerRecord> = rec
        .init
        .iter()
        .filter(|c| {
            if c.sidecar {
                !c.started
            } else {
                !c.succeeded()
            }
        })
        .collect();
    let unready: Vec<&ContainerRecord> = rec
        .containers
        .iter()
        .chain(rec.init.iter().filter(|c| c.sidecar))
        .filter(|c| !c.ready)
        .collect();
    let (reason, message) = if terminal {
        (Some("PodCompleted".to_string()), None)
    } else {
        (
            Some("ContainersNotReady".to_string()),
            Some(format!(
                "containers with unready status: {}",
                names(&unready)
            )),
        )
    };
    let all_ready = unready.is_empty() && !terminal;
    let conditions = vec![
        condition(
            transitions,
            now,
            "PodReadyToStartContainers",
            rec.sandbox_ready,
            None,
            None,
        ),
        condition(
            transitions,
            now,
            "Initialized",
            incomplete.is_empty() || (terminal && !rec.init_failed),
            Some(
                if terminal {
                    "PodCompleted"
                } else {
                    "ContainersNotInitialized"
                }
                .to_string(),
            ),
            (!terminal)
                .then(|| format!("containers with incomplete status: {}", names(&incomplete))),
        ),
        condition(
            transitions,
            now,
            "Ready",
            all_ready,
            reason.clone(),
            message.clone(),
        ),
        condition(
            transitions,
            now,
            "ContainersReady",
            all_ready,
            reason,
            message,
        ),
        scheduled.unwrap_or_else(|| condition(transitions, now, "PodScheduled", true, None, None)),
    ];
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: Some(rec.host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: rec.host_ip.to_string(),
        }]),
        pod_ip: rec.pod_ip.map(|i| i.to_string()),
        pod_ips: rec.pod_ip.map(|i| vec![PodIP { ip: i.to_string() }]),
        start_time: Some(Time(rec.start_time)),
        qos_class: None,
        container_statuses: Some(rec.containers.iter().map(ContainerRecord::to_api).collect()),
        init_container_statuses: Some(rec.init.iter().map(ContainerRecord::to_api).collect()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn running() -> State {
        State::Running { started_at: ts(1) }
    }

    fn exited(code: i32) -> State {
        State::Terminated {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: ts(1),
            finished_at: ts(2),
        }
    }

    fn c(state: State, last: Option<State>, ready: bool) -> ContainerRecord {
        ContainerRecord {
            state,
            last_state: last,
            ready,
            started: true,
            ..ContainerRecord::new("c", "img")
        }
    }

    fn pod(init: Vec<ContainerRecord>, containers: Vec<ContainerRecord>) -> PodRecord {
        PodRecord {
            init,
            containers,
            pod_ip: Some(Ipv4Addr::new(10, 216, 0, 2)),
            host_ip: Ipv4Addr::new(10, 216, 0, 1),
            start_time: ts(0),
            sandbox_ready: true,
            init_failed: false,
        }
    }

    #[test]
    fn phases() {
        let creating = State::waiting("ContainerCreating", None);
        let backoff = State::waiting("CrashLoopBackOff", None);
        let cases = [
            (
                pod(vec![], vec![c(creating.clone(), None, false)]),
                "Always",
                "Pending",
            ),
            (
                pod(
                    vec![c(running(), None, false)],
                    vec![c(creating.clone(), None, false)],
                ),
                "Always",
                "Pending",
            ),
            (
                pod(
                    vec![c(exited(0), None, true)],
                    vec![c(running(), None, true)],
                ),
                "Always",
                "Running",
            ),
            (
                pod(vec![], vec![c(exited(0), None, false)]),
                "Never",
                "Succeeded",
            ),
            (
                pod(vec![], vec![c(exited(1), None, false)]),
                "Never",
                "Failed",
            ),
            (
                pod(vec![], vec![c(exited(0), None, false)]),
                "OnFailure",
                "Succeeded",
            ),
            (
                pod(vec![], vec![c(backoff.clone(), Some(exited(1)), false)]),
                "OnFailure",
                "Running",
            ),
            (
                pod(vec![], vec![c(backoff, Some(exited(1)), false)]),
                "Always",
                "Running",
            ),
            (
                pod(vec![], vec![c(exited(0), None, false)]),
                "Always",
                "Running",
            ),
            (
                pod(
                    vec![],
                    vec![c(exited(0), None, false), c(running(), None, true)],
                ),
                "Never",
                "Running",
            ),
            (
                pod(
                    vec![],
                    vec![c(exited(0), None, false), c(exited(2), None, false)],
                ),
                "Never",
                "Failed",
            ),
        ];
        for (i, (rec, policy, want)) in cases.iter().enumerate() {
            assert_eq!(phase(rec, policy), *want, "case {i}");
        }
        let mut failed = pod(
            vec![c(exited(1), None, false)],
            vec![c(creating, None, false)],
        );
        failed.init_failed = true;
        assert_eq!(phase(&failed, "Never"), "Failed");
    }

    #[test]
    fn builds_conditions_and_keeps_transition_times() {
        let mut tr = Transitions::new();
        let mut rec = pod(vec![], vec![c(running(), None, false)]);
        let s = build(&rec, "Always", None, &mut tr, ts(10));
        let cond = |s: &PodStatus, t: &str| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == t)
                .cloned()
                .unwrap()
        };
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").status, "False");
        assert_eq!(
            cond(&s, "Ready").message.as_deref(),
            Some("containers with unready status: [c]")
        );
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(s.pod_ip.as_deref(), Some("10.216.0.2"));
        // Same state later: same status, same times.
        let again = build(&rec, "Always", None, &mut tr, ts(20));
        assert_eq!(again, s);
        rec.containers[0].ready = true;
        let ready = build(&rec, "Always", None, &mut tr, ts(30));
        assert_eq!(cond(&ready, "Ready").status, "True");
        assert_eq!(
            cond(&ready, "Ready").last_transition_time,
            Some(Time(ts(30)))
        );
        assert_eq!(
            cond(&ready, "Initialized").last_transition_time,
            Some(Time(ts(10)))
        );
        let cs = &ready.container_statuses.unwrap()[0];
        assert!(cs.ready);
        assert_eq!(cs.started, Some(true));
    }

    #[test]
    fn completed_pods_are_not_ready() {
        let mut tr = Transitions::new();
        let rec = pod(vec![], vec![c(exited(0), None, false)]);
        let s = build(&rec, "Never", None, &mut tr, ts(1));
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        let ready = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason.as_deref(), Some("PodCompleted"));
    }
}
