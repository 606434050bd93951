//! The kube-rs contender of `bench/apiserver.py`: `kube::runtime::watcher` with its default
//! `watcher::Config` (paged ListWatch, 500 per page, bookmarks on, the watch's default 290 s
//! server timeout, resourceVersion unset on the LIST) plus `default_backoff()`, into a
//! `reflector::store::<Pod>()` of fully decoded `k8s_openapi` Pods.
//!
//! It answers the protocol of the client-go oracle (`tools/k8s/oracle`), one JSON line per line
//! read on stdin:
//!
//! - `progress`: `{"resourceVersion", "lists", "events", "size", "synced"}`;
//! - `wait <rv>`: the same, once the store has applied an event at or past `rv` (no polling: the
//!   event loop wakes the waiter);
//! - `applied`: `{"applied": [[rv, stamp], ...]}`, every watch event applied since the previous
//!   `applied`, stamped with CLOCK_MONOTONIC seconds (Python's `time.monotonic()`) once the store
//!   holds it; the list is then cleared;
//! - anything else: `{"resourceVersion", "lists", "pods": [{"name", "uid", "resourceVersion",
//!   "labels"}]}`, pods sorted by name.
//!
//! kube-rs does not expose the watcher's cursor, so `resourceVersion` is the highest
//! resourceVersion of an object the store has applied (listed or watched), and `synced` says the
//! first listing is complete (`Event::InitDone`). `lists` counts `Event::Init` (a paged LIST
//! counts once), `events` the `Apply`/`Delete` events. It exits when stdin closes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Config};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Notify;

#[derive(Default)]
struct Progress {
    lists: AtomicU64,
    events: AtomicU64,
    max_rv: AtomicU64,
    wanted_rv: AtomicU64,
    synced: AtomicBool,
    reached: Notify,
    applied: Mutex<Vec<(u64, f64)>>,
}

impl Progress {
    fn note(&self, event: &watcher::Event<Pod>) {
        match event {
            watcher::Event::Init => {
                self.lists.fetch_add(1, Ordering::Relaxed);
            }
            watcher::Event::InitApply(pod) => {
                self.max_rv.fetch_max(resource_version(pod), Ordering::Relaxed);
            }
            watcher::Event::InitDone => self.synced.store(true, Ordering::Release),
            watcher::Event::Apply(pod) | watcher::Event::Delete(pod) => {
                let rv = resource_version(pod);
                let stamp = monotonic_seconds();
                self.events.fetch_add(1, Ordering::Relaxed);
                self.applied.lock().unwrap().push((rv, stamp));
                self.max_rv.fetch_max(rv, Ordering::Release);
                if rv >= self.wanted_rv.load(Ordering::Acquire) {
                    self.reached.notify_waiters();
                }
            }
        }
    }

    async fn wait_for(&self, rv: u64) {
        self.wanted_rv.store(rv, Ordering::Release);
        loop {
            let reached = self.reached.notified();
            if self.max_rv.load(Ordering::Acquire) >= rv {
                break;
            }
            reached.await;
        }
        self.wanted_rv.store(u64::MAX, Ordering::Release);
    }
}

fn resource_version(pod: &Pod) -> u64 {
    pod.metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

fn monotonic_seconds() -> f64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `now`, which outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

#[derive(Serialize)]
struct ProgressView {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
    lists: u64,
    events: u64,
    size: usize,
    synced: bool,
}

#[derive(Serialize)]
struct PodView<'a> {
    name: &'a str,
    uid: &'a str,
    #[serde(rename = "resourceVersion")]
    resource_version: &'a str,
    labels: &'a BTreeMap<String, String>,
}

struct Args {
    kubeconfig: String,
    namespace: String,
    selector: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { kubeconfig: String::new(), namespace: String::new(), selector: String::new() };
    for arg in std::env::args().skip(1) {
        let (flag, value) = arg.split_once('=').ok_or_else(|| format!("expected --flag=value, got {arg:?}"))?;
        match flag {
            "--kubeconfig" => args.kubeconfig = value.to_owned(),
            "--namespace" => args.namespace = value.to_owned(),
            "--selector" => args.selector = value.to_owned(),
            _ => return Err(format!("unknown flag {flag:?}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("kube-rs-oracle: {err}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let pods: Api<Pod> = if args.namespace.is_empty() {
        Api::all(client)
    } else {
        Api::namespaced(client, &args.namespace)
    };
    let mut watch_config = watcher::Config::default();
    if !args.selector.is_empty() {
        watch_config = watch_config.labels(&args.selector);
    }
    let (store, writer) = reflector::store::<Pod>();
    let progress = Arc::new(Progress { wanted_rv: AtomicU64::new(u64::MAX), ..Progress::default() });
    let events = reflector::reflector(writer, watcher(pods, watch_config).default_backoff());
    let noted = Arc::clone(&progress);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => noted.note(&event),
                Err(err) => eprintln!("kube-rs-oracle: watcher: {err}"),
            }
        }
    });
    answer_requests(&store, &progress).await
}

async fn answer_requests(store: &Store<Pod>, progress: &Progress) -> Result<(), Box<dyn std::error::Error>> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        let mut answer = match line.split_once(' ') {
            Some(("wait", rv)) => {
                progress.wait_for(rv.trim().parse()?).await;
                serde_json::to_vec(&progress_view(store, progress))?
            }
            _ if line == "progress" => serde_json::to_vec(&progress_view(store, progress))?,
            _ if line == "applied" => {
                let applied = std::mem::take(&mut *progress.applied.lock().unwrap());
                serde_json::to_vec(&serde_json::json!({ "applied": applied }))?
            }
            _ => snapshot(store, progress)?,
        };
        answer.push(b'\n');
        stdout.write_all(&answer).await?;
        stdout.flush().await?;
    }
    Ok(())
}

fn progress_view(store: &Store<Pod>, progress: &Progress) -> ProgressView {
    ProgressView {
        resource_version: progress.max_rv.load(Ordering::Acquire).to_string(),
        lists: progress.lists.load(Ordering::Relaxed),
        events: progress.events.load(Ordering::Relaxed),
        size: store.len(),
        synced: progress.synced.load(Ordering::Acquire),
    }
}

fn snapshot(store: &Store<Pod>, progress: &Progress) -> serde_json::Result<Vec<u8>> {
    let state = store.state();
    let empty = BTreeMap::new();
    let mut pods: Vec<PodView<'_>> = state
        .iter()
        .map(|pod| PodView {
            name: pod.metadata.name.as_deref().unwrap_or(""),
            uid: pod.metadata.uid.as_deref().unwrap_or(""),
            resource_version: pod.metadata.resource_version.as_deref().unwrap_or(""),
            labels: pod.metadata.labels.as_ref().unwrap_or(&empty),
        })
        .collect();
    pods.sort_by(|a, b| a.name.cmp(b.name));
    serde_json::to_vec(&serde_json::json!({
        "resourceVersion": progress.max_rv.load(Ordering::Acquire).to_string(),
        "lists": progress.lists.load(Ordering::Relaxed),
        "pods": pods,
    }))
}
