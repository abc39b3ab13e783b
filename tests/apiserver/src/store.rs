//! The in-memory object store: one global resourceVersion counter, a bounded
//! event log for watches, and the write semantics of the real server
//! (generation, status split, finalizers, optimistic concurrency, validation).

use crate::errors::{invalid, ApiError, FieldError};
use crate::resources::ResourceDef;
use crate::selectors::{FieldSelector, LabelSelector};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// How many events the log keeps; a watch from before the window gets 410 Gone.
pub const EVENT_WINDOW: usize = 1000;

/// One change, as streamed by watches.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    /// `group/plural` of the object.
    pub res: String,
    /// ADDED, MODIFIED or DELETED.
    pub etype: &'static str,
    pub object: Value,
    /// The object before the change (MODIFIED only), for selector transitions.
    pub old: Option<Value>,
}

/// Which objects a list or watch wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns) {
                return false;
            }
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

type Objects = BTreeMap<(String, String), Value>;

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: HashMap<String, Objects>,
    events: VecDeque<Arc<Event>>,
    /// The rv of the newest event dropped from the log (0 = none dropped).
    compacted: u64,
}

impl Inner {
    /// A copy of the stored object, or the API's NotFound.
    fn existing(&self, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&def.key())
            .and_then(|m| m.get(&(ns.unwrap_or_default().to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
    }
}

/// The shared store.
pub struct Store {
    inner: Mutex<Inner>,
    notify: tokio::sync::watch::Sender<u64>,
    pub defs: Vec<ResourceDef>,
}

/// The stable uid of the kube-system namespace.
pub const KUBE_SYSTEM_UID: &str = "6d1a8a3c-5f0e-4b7e-9c3a-000000000001";

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let o = obj.as_object_mut().expect("just made an object");
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("just made an object")
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The part of an object whose change bumps metadata.generation.
fn spec_part(obj: &Value) -> Value {
    if let Some(spec) = obj.get("spec") {
        return spec.clone();
    }
    let mut o = obj.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "status", "apiVersion", "kind"] {
        o.remove(k);
    }
    Value::Object(o)
}

fn random_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHA[*b as usize % ALPHA.len()] as char)
        .collect()
}

impl Store {
    pub fn new(defs: Vec<ResourceDef>) -> Arc<Self> {
        let (notify, _) = tokio::sync::watch::channel(0);
        let store = Arc::new(Store {
            inner: Mutex::new(Inner::default()),
            notify,
            defs,
        });
        if let Some(ns) = store.def("", "namespaces") {
            let ns = ns.clone();
            for (name, uid) in [
                ("default", None),
                ("kube-system", Some(KUBE_SYSTEM_UID)),
                ("kube-public", None),
                ("kube-node-lease", None),
            ] {
                let mut obj = json!({"metadata": {"name": name}});
                if let Some(uid) = uid {
                    obj["metadata"]["uid"] = json!(uid);
                }
                // Cannot fail: the store is empty and the names are distinct.
                let _ = store.create(&ns, None, obj);
            }
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic in another request; the data is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The resource served under `group` with this plural.
    pub fn def(&self, group: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs
            .iter()
            .find(|d| d.group == group && d.plural == plural)
    }

    pub fn def_gvr(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs
            .iter()
            .find(|d| d.group == group && d.version == version && d.plural == plural)
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }

    fn record(&self, inner: &mut Inner, ev: Event) {
        inner.events.push_back(Arc::new(ev));
        while inner.events.len() > EVENT_WINDOW {
            if let Some(old) = inner.events.pop_front() {
                inner.compacted = old.rv;
            }
        }
        self.notify.send_replace(inner.rv);
    }

    pub fn get(&self, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.lock().existing(def, ns, name)
    }

    /// Matching objects (sorted by namespace/name) and the current resourceVersion.
    pub fn list(&self, def: &ResourceDef, filter: &Filter) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .get(&def.key())
            .map(|m| m.values().filter(|o| filter.matches(o)).cloned().collect())
            .unwrap_or_default();
        (items, inner.rv)
    }

    /// Events of `res` newer than `since`; Err(410) when `since` fell out of the window.
    pub fn events_since(&self, res: &str, since: u64) -> Result<Vec<Arc<Event>>, ApiError> {
        let inner = self.lock();
        if since < inner.compacted {
            return Err(ApiError::gone(format!(
                "too old resource version: {since} ({})",
                inner.compacted + 1
            )));
        }
        Ok(inner
            .events
            .iter()
            .filter(|e| e.rv > since && e.res == res)
            .cloned()
            .collect())
    }

    fn validate(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let mut errs: Vec<FieldError> = Vec::new();
        if let Some(schema) = &def.schema {
            errs = crate::validation::validate_custom(schema, obj, old);
        }
        if let Some(old) = old {
            if !meta_str(old, "deletionTimestamp").is_empty() {
                let before = finalizers(old);
                if finalizers(obj).iter().any(|f| !before.contains(f)) {
                    errs.push(FieldError::forbidden(
                        "metadata.finalizers",
                        "no new finalizers can be added if the object is being deleted",
                    ));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(invalid(&def.kind, &def.group, meta_str(obj, "name"), &errs))
        }
    }

    /// Create an object; `ns` is the namespace from the path.
    pub fn create(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        obj["apiVersion"] = json!(def.api_version());
        obj["kind"] = json!(def.kind);
        let body_ns = meta_str(&obj, "namespace").to_string();
        let m = meta_mut(&mut obj);
        if def.namespaced {
            let ns = ns.unwrap_or("default");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let gen = m
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if gen.is_empty() {
                return Err(invalid(
                    &def.kind,
                    &def.group,
                    "",
                    &[FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            name = format!("{gen}{}", random_suffix());
            m.insert("name".into(), json!(name));
        }
        if m.get("uid")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        }
        m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        m.insert("generation".into(), json!(1));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
        ] {
            m.remove(k);
        }
        if def.status_subresource {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        match (def.group.as_str(), def.plural.as_str()) {
            ("", "pods") => obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"}),
            ("", "namespaces") => obj["status"] = json!({"phase": "Active"}),
            _ => {}
        }
        self.validate(def, &mut obj, None)?;

        let mut inner = self.lock();
        let key = (meta_str(&obj, "namespace").to_string(), name.clone());
        let objects = inner.objects.entry(def.key()).or_default();
        if objects.contains_key(&key) {
            return Err(ApiError::already_exists(&def.group, &def.plural, &name));
        }
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        inner
            .objects
            .entry(def.key())
            .or_default()
            .insert(key, obj.clone());
        self.record(
            &mut inner,
            Event {
                rv,
                res: def.key(),
                etype: "ADDED",
                object: obj.clone(),
                old: None,
            },
        );
        Ok(obj)
    }

    /// Read-modify-write under the lock: `change` gets the current object and
    /// returns the desired one. `status` is true for the /status subresource.
    pub fn update(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        status: bool,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        let mut inner = self.lock();
        let old = inner.existing(def, ns, name)?;
        let mut new = change(&old)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let body_name = meta_str(&new, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let wanted_rv = meta_str(&new, "resourceVersion").to_string();
        if !wanted_rv.is_empty() && wanted_rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
        if status {
            let mut merged = old.clone();
            match new.get("status") {
                Some(s) => merged["status"] = s.clone(),
                None => {
                    if let Some(o) = merged.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            new = merged;
        } else if def.status_subresource {
            let o = new.as_object_mut().expect("checked is_object above");
            match old.get("status") {
                Some(s) => {
                    o.insert("status".into(), s.clone());
                }
                None => {
                    o.remove("status");
                }
            }
        }
        new["apiVersion"] = json!(def.api_version());
        new["kind"] = json!(def.kind);
        {
            let old_meta = old.get("metadata").cloned().unwrap_or_default();
            let m = meta_mut(&mut new);
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match old_meta.get(k) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
        }
        self.validate(def, &mut new, Some(&old))?;
        if spec_part(&new) != spec_part(&old) {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        let deleting = !meta_str(&old, "deletionTimestamp").is_empty();
        let remove = deleting && finalizers(&new).is_empty();
        if new == old && !remove {
            return Ok(old);
        }
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let objects = inner.objects.entry(def.key()).or_default();
        let etype = if remove {
            objects.remove(&key);
            "DELETED"
        } else {
            objects.insert(key, new.clone());
            "MODIFIED"
        };
        self.record(
            &mut inner,
            Event {
                rv,
                res: def.key(),
                etype,
                object: new.clone(),
                old: Some(old),
            },
        );
        Ok(new)
    }

    /// Delete: objects with finalizers get a deletionTimestamp, others go at once.
    /// `precondition` holds optional (uid, resourceVersion) from DeleteOptions.
    pub fn delete(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        precondition: (Option<String>, Option<String>),
    ) -> Result<Value, ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        let mut inner = self.lock();
        let old = inner.existing(def, ns, name)?;
        if let Some(uid) = precondition.0 {
            if uid != meta_str(&old, "uid") {
                return Err(ApiError::conflict(&def.group, &def.plural, name));
            }
        }
        if let Some(rv) = precondition.1 {
            if rv != meta_str(&old, "resourceVersion") {
                return Err(ApiError::conflict(&def.group, &def.plural, name));
            }
        }
        if !finalizers(&old).is_empty() {
            if !meta_str(&old, "deletionTimestamp").is_empty() {
                return Ok(old);
            }
            let mut new = old.clone();
            inner.rv += 1;
            let rv = inner.rv;
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            inner
                .objects
                .entry(def.key())
                .or_default()
                .insert(key, new.clone());
            self.record(
                &mut inner,
                Event {
                    rv,
                    res: def.key(),
                    etype: "MODIFIED",
                    object: new.clone(),
                    old: Some(old),
                },
            );
            return Ok(new);
        }
        inner.rv += 1;
        let rv = inner.rv;
        let mut gone = old;
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(rv.to_string()));
        if let Some(m) = inner.objects.get_mut(&def.key()) {
            m.remove(&key);
        }
        self.record(
            &mut inner,
            Event {
                rv,
                res: def.key(),
                etype: "DELETED",
                object: gone.clone(),
                old: None,
            },
        );
        Ok(gone)
    }
}
