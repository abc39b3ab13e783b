//! Fleet policy keys of a provider entry: `maxUnavailable`.

use serde_norway::Value;

use crate::fleet::MaxUnavailable;

/// `maxUnavailable`: a count (`2`) or a percent (`"25%"`); default 1.
pub(super) fn max_unavailable(v: Option<Value>) -> Result<MaxUnavailable, String> {
    let text = match v {
        None | Some(Value::Null) => return Ok(MaxUnavailable::default()),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(
                "maxUnavailable must be a count such as 2 or a percent such as \"25%\"".into(),
            )
        }
    };
    MaxUnavailable::parse(&text).map_err(|why| format!("maxUnavailable {why}"))
}

#[cfg(test)]
mod tests {
    use crate::config::ProvidersConfig;
    use crate::fleet::MaxUnavailable;

    #[test]
    fn max_unavailable_key_table() {
        struct Case {
            name: &'static str,
            value: &'static str,
            want: Result<MaxUnavailable, &'static str>,
        }
        let cases = [
            Case {
                name: "absent: 1",
                value: "",
                want: Ok(MaxUnavailable::Count(1)),
            },
            Case {
                name: "a count",
                value: "maxUnavailable: 3",
                want: Ok(MaxUnavailable::Count(3)),
            },
            Case {
                name: "a quoted percent",
                value: "maxUnavailable: \"20%\"",
                want: Ok(MaxUnavailable::Percent(20)),
            },
            Case {
                name: "a negative count names the key",
                value: "maxUnavailable: -2",
                want: Err("providers[0] \"k\": maxUnavailable \"-2\" must be a count such as 2 or a percent such as 25%"),
            },
            Case {
                name: "a fraction names the key",
                value: "maxUnavailable: 1.5",
                want: Err("providers[0] \"k\": maxUnavailable \"1.5\" must be a count such as 2 or a percent such as 25%"),
            },
            Case {
                name: "a list names the key",
                value: "maxUnavailable: [1]",
                want: Err("providers[0] \"k\": maxUnavailable must be a count such as 2 or a percent such as \"25%\""),
            },
            Case {
                name: "over 100% names the key",
                value: "maxUnavailable: 101%",
                want: Err("providers[0] \"k\": maxUnavailable \"101%\" is more than 100%"),
            },
        ];
        for c in cases {
            let doc = format!("providers:\n- name: k\n  type: kubernetes\n  {}\n", c.value);
            let got = ProvidersConfig::from_slice(doc.as_bytes())
                .map(|cfg| cfg.providers[0].max_unavailable)
                .map_err(|e| e.to_string());
            assert_eq!(got, c.want.map_err(String::from), "{}", c.name);
        }
    }
}
