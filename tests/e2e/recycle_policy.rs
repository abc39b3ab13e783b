//! Recycle policy on an injected clock (issue 32): the real reconcile, the
//! real fleet view over a cache the test fills, the fake provider, and a
//! clock the test steps 10 minutes through in 5 s steps. Two always-failing
//! Proxies of one namespace recycle for ever; their creates must keep to
//! the replace back-off, and another namespace's Proxy that turns unhealthy
//! must still get its turn at the provider's one-at-a-time budget.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::controller::plan::replace::replace_delay;
use egress_proxies_operator::fleet::Fleet;
use egress_proxies_operator::fleet::{MaxUnavailable, MIN_UNHEALTHY_FOR};
use egress_proxies_operator::lease::{Clock, FakeClock};
use egress_proxies_operator::provider::fake::FakeProvider;
use egress_proxies_operator::provider::Op;
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;

use crate::scenario::Scenario;
use crate::support::{self, condition};

const STEP: Duration = Duration::from_secs(5);
const RUN: Duration = Duration::from_secs(600);

/// Who fails: the first two always, `late` from two minutes on until its
/// instance is replaced, the rest never.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    AlwaysFailing,
    Late,
    Steady,
}

struct Member {
    api: Api<Proxy>,
    name: &'static str,
    role: Role,
    /// When each of its creates went, by the injected clock.
    creates: Vec<DateTime<Utc>>,
}

async fn refresh(writer: &mut Writer<Proxy>, apis: &[&Api<Proxy>]) {
    for api in apis {
        for p in api.list(&ListParams::default()).await.unwrap().items {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_always_fails_backs_off_and_leaves_room_for_other_namespaces() {
    let clock = FakeClock::at(Utc::now());
    let (cache, mut writer) = reflector::store::<Proxy>();
    let budgets = BTreeMap::from([("fake".to_string(), MaxUnavailable::Count(1))]);
    // No discovery API: a drain waits only for its notice.
    let fleet = Arc::new(Fleet::new(Some(cache), budgets, Duration::ZERO).with_leases(None));
    let fake = FakeProvider::new("fake");
    let (c, f) = (clock.clone(), fleet.clone());
    let s = Scenario::built(
        "recycle-a",
        fake.clone(),
        0.0,
        "    createsPerMinute: 600\n",
        move |ctx| ctx.with_clock(Arc::new(c)).with_fleet(f),
    )
    .await;
    let other = support::ground("recycle-b").await;
    let other_api = other.proxies();
    // unhealthyFor below the minimum: it counts as the minimum.
    let spec = json!({"provider": "fake", "port": 3128, "recycle": {"unhealthyFor": "5s", "drainTimeout": "1m"}});
    let mut members = vec![
        ("fails-1", Role::AlwaysFailing, &s.proxies),
        ("fails-2", Role::AlwaysFailing, &s.proxies),
        ("late", Role::Late, &other_api),
        ("steady-1", Role::Steady, &other_api),
        ("steady-2", Role::Steady, &other_api),
        ("steady-3", Role::Steady, &other_api),
    ]
    .into_iter()
    .map(|(name, role, api)| Member {
        api: api.clone(),
        name,
        role,
        creates: Vec::new(),
    })
    .collect::<Vec<_>>();
    for m in &members {
        m.api
            .create(
                &PostParams::default(),
                &support::proxy(m.name, spec.clone()),
            )
            .await
            .unwrap();
    }
    let start = clock.now();
    let late_from = start + chrono::Duration::seconds(120);
    let mut late_replaced_at = None;
    let mut backoff_seen = false;
    let steps = RUN.as_secs() / STEP.as_secs();
    for _ in 0..steps {
        clock.advance(STEP);
        let now = clock.now();
        refresh(&mut writer, &[&s.proxies, &other_api]).await;
        for m in members.iter_mut() {
            let p = m.api.get(m.name).await.unwrap();
            let ip = p.status.as_ref().and_then(|st| st.ip.clone());
            let failing = match m.role {
                Role::AlwaysFailing => true,
                Role::Late => now >= late_from && late_replaced_at.is_none(),
                Role::Steady => false,
            };
            if ip.is_some() {
                s.health.set_at(&p, !failing, "probe result", now);
            }
            let before = fake.calls(Op::Create);
            let _ = egress_proxies_operator::controller::reconcile::reconcile(
                Arc::new(p),
                s.ctx.clone(),
            )
            .await;
            if fake.calls(Op::Create) > before {
                m.creates.push(now);
                if m.role == Role::Late && now > late_from {
                    late_replaced_at = Some(now);
                }
            }
            let after = m.api.get(m.name).await.unwrap();
            if condition(&after, "Provisioned").is_some_and(|c| c.reason == "ReplaceBackoff") {
                backoff_seen = true;
            }
        }
    }
    for m in &members {
        let at: Vec<i64> = m
            .creates
            .iter()
            .map(|t| (*t - start).num_seconds())
            .collect();
        println!("{} ({:?}): creates at {at:?} s", m.name, m.role);
    }
    let min = chrono::Duration::from_std(MIN_UNHEALTHY_FOR).unwrap();
    for m in members.iter().filter(|m| m.role == Role::AlwaysFailing) {
        assert!(
            m.creates.len() >= 4,
            "{} was recycled {} times: the run should see the back-off grow",
            m.name,
            m.creates.len() - 1
        );
        // The n-th replacement in a row waits replace_delay(n) before its
        // create, after the new instance was unhealthy for unhealthyFor.
        for (n, pair) in m.creates.windows(2).enumerate() {
            let gap = pair[1] - pair[0];
            let backoff = chrono::Duration::from_std(replace_delay(n as u32 + 1)).unwrap();
            assert!(
                gap >= min + backoff,
                "{}: create {} came {}s after the one before, under unhealthyFor {}s + back-off {}s",
                m.name,
                n + 1,
                gap.num_seconds(),
                min.num_seconds(),
                backoff.num_seconds()
            );
        }
    }
    assert!(
        backoff_seen,
        "a Proxy showed Provisioned=False/ReplaceBackoff"
    );
    let late = members.iter().find(|m| m.role == Role::Late).unwrap();
    let replaced = late_replaced_at.expect("the other namespace's unhealthy Proxy was recycled");
    let waited = (replaced - late_from).num_seconds();
    println!(
        "the other namespace's Proxy got its new instance {waited}s after it turned unhealthy"
    );
    assert!(
        waited <= 120,
        "it waited {waited}s: the failing namespace held the budget"
    );
    assert_eq!(late.creates.len(), 2, "replaced once: {:?}", late.creates);
    for m in members.iter().filter(|m| m.role == Role::Steady) {
        assert_eq!(m.creates.len(), 1, "{} is never touched", m.name);
    }
}
