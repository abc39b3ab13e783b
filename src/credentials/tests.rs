use k8s_openapi::ByteString;

use super::*;

fn owner() -> Owner<'static> {
    Owner {
        namespace: "crawl",
        proxy_name: "p1",
        uid: "uid-1",
        installation_id: "inst",
    }
}

fn stored(username: &[u8], password: &[u8]) -> Secret {
    let mut data = BTreeMap::new();
    data.insert(USERNAME_KEY.to_string(), ByteString(username.to_vec()));
    data.insert(PASSWORD_KEY.to_string(), ByteString(password.to_vec()));
    Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

#[test]
fn generated_passwords_are_long_random_and_url_safe() {
    let a = Credentials::generate("u").unwrap();
    let b = Credentials::generate("u").unwrap();
    assert_ne!(a.expose(), b.expose());
    assert_eq!(a.expose().len(), 32);
    assert!(a
        .expose()
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
}

#[test]
fn the_htpasswd_line_verifies_the_password_and_no_other() {
    let c = Credentials::new("proxy-a", "s3cret");
    let line = c.htpasswd().unwrap();
    let (user, hash) = line.trim_end().split_once(':').unwrap();
    assert_eq!(user, "proxy-a");
    assert!(hash.starts_with("$6$rounds=1000$"), "{hash}");
    assert!(sha512_check("s3cret", hash));
    assert!(!sha512_check("s3cres", hash));
    assert_ne!(line, c.htpasswd().unwrap(), "each line has its own salt");
}

/// crypt(3)'s check, by recomputing with the line's own rounds and salt.
fn sha512_check(password: &str, hash: &str) -> bool {
    let mut parts = hash.split('$').skip(2);
    let rounds = parts.next().unwrap().strip_prefix("rounds=").unwrap();
    let (salt, want) = (parts.next().unwrap(), parts.next().unwrap());
    let params = sha_crypt::Sha512Params::new(rounds.parse().unwrap()).unwrap();
    let got = sha_crypt::sha512_crypt_b64(password.as_bytes(), salt.as_bytes(), &params).unwrap();
    got == want
}

#[test]
fn the_password_never_shows_in_debug_output() {
    let c = Credentials::new("proxy-a", "hunter2-secret");
    let shown = format!("{c:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("proxy-a"));
}

#[test]
fn proxy_authorization_is_basic_of_user_and_password() {
    let c = Credentials::new("Aladdin", "open sesame");
    assert_eq!(
        c.proxy_authorization(),
        "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
    );
}

#[test]
fn secrets_are_read_or_refused_naming_the_key() {
    type Case<'a> = (&'a [u8], &'a [u8], Result<(&'a str, &'a str), &'a str>);
    let table: &[Case] = &[
        (b"u", b"p", Ok(("u", "p"))),
        (b"", b"p", Err("no \"username\" key")),
        (b"u", b"", Err("no \"password\" key")),
        (b"a:b", b"p", Err("cannot hold ':'")),
        (
            b"u",
            &[0xff, 0xfe],
            Err("\"password\" is not usable: not UTF-8"),
        ),
    ];
    for (user, pass, want) in table {
        let got = Credentials::from_secret(&stored(user, pass));
        match (got, want) {
            (Ok(c), Ok((u, p))) => {
                assert_eq!((c.username.as_str(), c.expose()), (*u, *p));
            }
            (Err(e), Err(words)) => {
                let msg = e.to_string();
                assert!(msg.contains(words), "{msg:?} should say {words:?}");
            }
            (got, want) => panic!("{got:?} vs {want:?}"),
        }
    }
}

#[test]
fn the_generated_secret_is_owned_labelled_and_complete() {
    let c = Credentials::new("proxy-a", "pw");
    let s = secret("proxy-a", &owner(), &c, "proxy-a:$6$rounds=1000$s$h\n");
    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[CREDENTIALS_SECRET_LABEL], "true");
    assert_eq!(labels[UID_MARK], "uid-1");
    assert_eq!(labels[PROXY_NAME_LABEL], "p1");
    let owner_ref = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner_ref.kind.as_str(), owner_ref.uid.as_str()),
        ("Proxy", "uid-1")
    );
    let data = s.string_data.as_ref().unwrap();
    assert_eq!(data[USERNAME_KEY], "proxy-a");
    assert_eq!(data[PASSWORD_KEY], "pw");
    assert_eq!(data[HTPASSWD_KEY], "proxy-a:$6$rounds=1000$s$h\n");
}

#[test]
fn the_url_carries_escaped_credentials_and_debug_hides_it() {
    let c = Credentials::new("u@x", "p:w/d");
    let url = c.url("10.0.0.1", 3128);
    assert_eq!(url.expose(), "http://u%40x:p%3Aw%2Fd@10.0.0.1:3128");
    assert_eq!(format!("{url:?}"), "<redacted>");
    let c = Credentials::new("proxy-a", "abc");
    assert_eq!(
        c.url("[fd00::1]", 80).expose(),
        "http://proxy-a:abc@[fd00::1]:80"
    );
}
