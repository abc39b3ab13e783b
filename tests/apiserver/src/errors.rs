//! Kubernetes `Status` error bodies.

use serde_json::{json, Value};

/// An API error, rendered as a `kind: Status` body with the same HTTP code.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: Value::Null,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// `404 NotFound` for `resource.group "name"`.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", qualified(resource, group), name),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", qualified(resource, group), name),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(resource, group),
                name
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !self.details.is_null() {
            s["details"] = self.details.clone();
        }
        s
    }
}

/// `resource.group`, or just `resource` for the core group.
pub fn qualified(name: &str, group: &str) -> String {
    if group.is_empty() {
        name.to_string()
    } else {
        format!("{name}.{group}")
    }
}

/// A field error as the real server words it (`field: Type: detail`).
#[derive(Debug, Clone)]
pub struct FieldError {
    pub field: String,
    /// Machine reason, e.g. FieldValueInvalid.
    pub reason: &'static str,
    /// Full message, e.g. `spec.port: Invalid value: 70000: ...`.
    pub message: String,
}

impl FieldError {
    pub fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        FieldError {
            field: field.to_string(),
            reason: "FieldValueInvalid",
            message: format!("{field}: Invalid value: {}: {detail}", render_value(value)),
        }
    }
    pub fn required(field: &str, detail: &str) -> Self {
        let message = if detail.is_empty() {
            format!("{field}: Required value")
        } else {
            format!("{field}: Required value: {detail}")
        };
        FieldError {
            field: field.to_string(),
            reason: "FieldValueRequired",
            message,
        }
    }
    pub fn not_supported(field: &str, value: &Value, allowed: &[Value]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        FieldError {
            field: field.to_string(),
            reason: "FieldValueNotSupported",
            message: format!(
                "{field}: Unsupported value: {}: supported values: {}",
                value,
                allowed.join(", ")
            ),
        }
    }
    pub fn forbidden(field: &str, detail: &str) -> Self {
        FieldError {
            field: field.to_string(),
            reason: "FieldValueForbidden",
            message: format!("{field}: Forbidden: {detail}"),
        }
    }
    pub fn too_long(field: &str, max: u64) -> Self {
        FieldError {
            field: field.to_string(),
            reason: "FieldValueTooLong",
            message: format!("{field}: Too long: may not be more than {max} bytes"),
        }
    }
}

/// How the real server prints a value inside an `Invalid value:` message.
fn render_value(v: &Value) -> String {
    match v {
        Value::String(_) => v.to_string(),
        Value::Number(_) | Value::Bool(_) => v.to_string(),
        Value::Null => "null".into(),
        Value::Array(_) => "\"array\"".into(),
        Value::Object(_) => "\"object\"".into(),
    }
}

/// 422 Invalid for `Kind.group "name"` with the given field errors.
pub fn invalid(kind: &str, group: &str, name: &str, errs: &[FieldError]) -> ApiError {
    let joined = if errs.len() == 1 {
        errs[0].message.clone()
    } else {
        format!(
            "[{}]",
            errs.iter()
                .map(|e| e.message.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let causes: Vec<Value> = errs
        .iter()
        .map(|e| {
            let short = e
                .message
                .strip_prefix(&format!("{}: ", e.field))
                .unwrap_or(&e.message);
            json!({"reason": e.reason, "message": short, "field": e.field})
        })
        .collect();
    ApiError::new(
        422,
        "Invalid",
        format!(
            "{} \"{}\" is invalid: {}",
            qualified(kind, group),
            name,
            joined
        ),
    )
    .with_details(json!({"name": name, "group": group, "kind": kind, "causes": causes}))
}
