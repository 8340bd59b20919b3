//! The service API of `idem serve`: the real router over the memory store,
//! fed any method, path, headers and body. Nothing may panic, and every
//! error is a problem+json body whose `status` is the response's; no input
//! is a server error.
#![no_main]

use std::cell::RefCell;

use arbitrary::Arbitrary;
use axum::Router;
use axum::body::Body;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::MemoryStore;
use idem_fuzz::runtime;
use idem_http::api::{ApiConfig, ApiState, Auth, Detached, Grant, Namespaces, router};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

const ROUTES: &[&str] = &[
    "begin",
    "complete",
    "release",
    "extend",
    "begin-batch",
    "complete-batch",
    "record",
];

#[derive(Arbitrary, Debug)]
enum Path<'a> {
    /// `/v1/{ns}/{route}?{query}`: reaches the handlers.
    Route {
        ns: &'a str,
        route: u8,
        query: Option<&'a str>,
    },
    /// Any bytes a client could send as the target.
    Raw(&'a [u8]),
}

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    method: u8,
    other_method: &'a [u8],
    path: Path<'a>,
    json: bool,
    bearer: Option<&'a str>,
    headers: Vec<(&'a [u8], &'a [u8])>,
    body: &'a [u8],
    with_auth: bool,
}

struct App {
    open: Router,
    guarded: Router,
    uses: usize,
}

impl App {
    fn new() -> Self {
        // Small limits, so that the fuzzer reaches them.
        let store = MemoryStore::builder()
            .limits(idem_core::Limits {
                max_key_bytes: 32,
                max_outcome_bytes: 256,
                max_batch: 8,
                ..idem_core::Limits::default()
            })
            .build();
        let state = |auth| ApiState {
            store: std::sync::Arc::new(store.clone()),
            config: ApiConfig {
                max_body_bytes: 4096,
                ..ApiConfig::default()
            },
            auth,
            metrics: None,
            detached: Detached::default(),
        };
        let grant = Grant::new("secret", Namespaces::Only(vec!["orders".into()]));
        Self {
            open: router(state(Auth::default())),
            guarded: router(state(Auth::new(vec![grant]))),
            uses: 0,
        }
    }
}

thread_local! {
    static APP: RefCell<App> = RefCell::new(App::new());
}

fn request(input: &Input<'_>) -> Option<Request<Body>> {
    let method = match input.method % 6 {
        0 | 1 => Method::POST,
        2 => Method::GET,
        3 => Method::PUT,
        4 => Method::DELETE,
        _ => Method::from_bytes(input.other_method).ok()?,
    };
    let target = match &input.path {
        Path::Route { ns, route, query } => {
            let route = ROUTES[usize::from(*route) % ROUTES.len()];
            match query {
                Some(q) => format!("/v1/{ns}/{route}?{q}"),
                None => format!("/v1/{ns}/{route}"),
            }
        }
        Path::Raw(raw) => String::from_utf8_lossy(raw).into_owned(),
    };
    // A target or header hyper would refuse never reaches the router.
    let uri = http::Uri::try_from(target).ok()?;
    let mut req = Request::builder().method(method).uri(uri);
    if input.json {
        req = req.header("content-type", "application/json");
    }
    if let Some(token) = input.bearer {
        req = req.header(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).ok()?,
        );
    }
    for (name, value) in &input.headers {
        let name = HeaderName::from_bytes(name).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        req = req.header(name, value);
    }
    req.body(Body::from(input.body.to_vec())).ok()
}

fn check(status: StatusCode, content_type: Option<&HeaderValue>, body: &[u8]) {
    assert!(
        !status.is_server_error(),
        "input got {status}: {}",
        String::from_utf8_lossy(body)
    );
    if status.is_client_error() {
        assert_eq!(
            content_type.map(HeaderValue::as_bytes),
            Some(&b"application/problem+json"[..]),
            "a {status} is a problem"
        );
        let problem: serde_json::Value = serde_json::from_slice(body).expect("a problem is JSON");
        assert_eq!(problem["status"], status.as_u16(), "{problem}");
        assert!(
            problem["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:idem:problem:")),
            "{problem}"
        );
        assert!(problem["detail"].is_string(), "{problem}");
    }
}

fuzz_target!(|input: Input<'_>| {
    let Some(req) = request(&input) else {
        return;
    };
    let app = APP.with(|app| {
        let mut app = app.borrow_mut();
        // A fresh store now and then, so records do not pile up.
        app.uses += 1;
        if app.uses == 4096 {
            *app = App::new();
        }
        if input.with_auth {
            app.guarded.clone()
        } else {
            app.open.clone()
        }
    });
    runtime().block_on(async move {
        let response = app.oneshot(req).await.expect("the router is infallible");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("a body").to_bytes();
        check(
            parts.status,
            parts.headers.get(http::header::CONTENT_TYPE),
            &body,
        );
    });
});
