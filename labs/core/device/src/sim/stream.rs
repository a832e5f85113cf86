//! Streams and events of the simulated GPU. Each stream is a worker thread that runs
//! its queue in order, so work really is asynchronous: a host that reads results
//! without synchronising sees stale data, just as on a GPU. The thread starts with the
//! stream's first work; a thread the system cannot start is that work's error.

use crate::clock::Instant;
use std::any::Any;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use crate::backend::{DeviceId, Event, EventImpl, Stream, StreamImpl};
use crate::error::{Error, Result};

pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// Work that can run more than once: what a capture records and a graph replays.
pub(crate) type Node = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// A stream's capture: the work recorded so far, and the first forbidden call, which
/// invalidated it.
#[derive(Default)]
struct Capture {
    nodes: Vec<Node>,
    invalid: Option<(&'static str, String)>,
}

/// What a stream's queue holds: work, or an event to signal. Signals are handled by the
/// worker itself so that the stream's progress and its events agree, as on a GPU.
enum Work {
    Run(Job),
    Signal(Arc<SimEventInner>, u64),
}

#[derive(Default)]
struct Progress {
    submitted: u64,
    completed: u64,
    /// The first failure since the last synchronize, reported there (a GPU reports a
    /// faulting kernel at the next synchronising call, not at launch).
    error: Option<Error>,
}

pub(crate) struct SimStream {
    handle: u64,
    /// `None` for the host device, whose "stream" runs work inline.
    queue: Option<Mutex<Queue>>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
    /// While capturing: what the stream records instead of running (`graphs.rs`).
    capture: Mutex<Option<Capture>>,
    /// Run after each synchronisation of the stream: the stream-ordered pools give
    /// memory back there (`async_pool.rs`).
    on_synchronize: OnceLock<SyncHook>,
}

/// What a synchronisation of a stream sets off.
pub(crate) type SyncHook = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// A threaded stream's queue: its worker's name, and the way to it once started.
struct Queue {
    name: String,
    worker: Option<Sender<Work>>,
}

impl SimStream {
    /// A stream whose work runs in order on a worker thread of its own, started with
    /// its first work.
    /// In WebAssembly, where no thread can start (the book's calculator runs only dry
    /// runs there, whose streams have no work to run), the stream runs inline.
    pub fn threaded(handle: u64, name: String) -> Arc<Self> {
        if cfg!(target_arch = "wasm32") {
            drop(name);
            return SimStream::inline(handle);
        }
        Arc::new(SimStream {
            handle,
            queue: Some(Mutex::new(Queue { name, worker: None })),
            progress: Arc::default(),
            capture: Mutex::new(None),
            on_synchronize: OnceLock::new(),
        })
    }

    // ANCHOR: stream_worker
    /// Starts the worker thread that runs the queue `rx` in order, reporting to
    /// `progress`.
    fn start_worker(name: &str, progress: Arc<(Mutex<Progress>, Condvar)>) -> Result<Sender<Work>> {
        let (tx, rx) = channel::<Work>();
        crate::threads::spawn(name.to_string(), "a stream worker", move || {
            // Ends when the stream, and so the sender, is dropped.
            for work in rx {
                let (outcome, signal) = match work {
                    Work::Run(job) => (job(), None),
                    Work::Signal(event, generation) => (Ok(()), Some((event, generation))),
                };
                let (lock, cv) = &*progress;
                let mut p = lock.lock().unwrap();
                p.completed += 1;
                if let Err(e) = outcome {
                    p.error.get_or_insert(e);
                }
                // The event fires while the progress lock is held, so that the
                // stream's being done and its events' completion are seen together
                // from either side: a synchronize that returns finds every recorded
                // event complete, and whoever sees an event complete finds the stream
                // done.
                if let Some((event, generation)) = signal {
                    event.complete(generation);
                }
                cv.notify_all();
                drop(p);
            }
        })?;
        Ok(tx)
    }
    // ANCHOR_END: stream_worker

    pub fn inline(handle: u64) -> Arc<Self> {
        Arc::new(SimStream {
            handle,
            queue: None,
            progress: Arc::default(),
            capture: Mutex::new(None),
            on_synchronize: OnceLock::new(),
        })
    }

    /// Runs `hook` after each synchronisation of this stream (set once).
    pub fn on_synchronize(&self, hook: SyncHook) {
        let _ = self.on_synchronize.set(hook);
    }

    /// Appends work; returns at once on a threaded stream.
    pub fn enqueue(&self, job: Job) -> Result<()> {
        self.push(Work::Run(job))
    }

    /// Appends work that can run again: recorded instead while the stream captures.
    pub fn submit(&self, node: Node) -> Result<()> {
        {
            let mut capture = self.capture.lock().unwrap();
            if let Some(c) = capture.as_mut() {
                if let Some((call, detail)) = &c.invalid {
                    return Err(self.capture_error(call, detail.clone()));
                }
                c.nodes.push(node);
                return Ok(());
            }
        }
        self.enqueue(Box::new(move || node()))
    }

    fn capture_error(&self, call: &'static str, detail: String) -> Error {
        Error::Capture {
            call,
            stream: format!("stream {}", self.handle),
            detail,
        }
    }

    /// An error, and the capture invalidated, if the stream captures: `call` is one a
    /// capture forbids.
    pub fn forbid_in_capture(&self, call: &'static str, detail: &str) -> Result<()> {
        let mut capture = self.capture.lock().unwrap();
        let Some(c) = capture.as_mut() else {
            return Ok(());
        };
        c.invalid.get_or_insert((call, detail.to_string()));
        Err(self.capture_error(call, detail.to_string()))
    }

    /// Starts recording. The default stream (CUDA's legacy stream) cannot capture, nor
    /// the host's inline one, nor a stream already capturing.
    pub fn begin_capture(&self) -> Result<()> {
        if self.handle == 0 || self.queue.is_none() {
            return Err(Error::InvalidArgument(
                "the default stream cannot be captured (CUDA's legacy stream synchronises \
                 with every other): capture on a stream of your own"
                    .into(),
            ));
        }
        let mut capture = self.capture.lock().unwrap();
        if capture.is_some() {
            return Err(Error::InvalidArgument(format!(
                "stream {} is already capturing",
                self.handle
            )));
        }
        *capture = Some(Capture::default());
        Ok(())
    }

    /// Ends the capture: what it recorded, or the error that invalidated it.
    pub fn end_capture(&self) -> Result<Vec<Node>> {
        let capture = self.capture.lock().unwrap().take();
        match capture {
            None => Err(Error::InvalidArgument(format!(
                "stream {} is not capturing",
                self.handle
            ))),
            Some(Capture {
                invalid: Some((call, detail)),
                ..
            }) => Err(self.capture_error(call, detail)),
            Some(c) => Ok(c.nodes),
        }
    }

    pub fn is_capturing(&self) -> bool {
        self.capture.lock().unwrap().is_some()
    }

    fn push(&self, work: Work) -> Result<()> {
        match &self.queue {
            None => match work {
                Work::Run(job) => job(),
                Work::Signal(event, generation) => {
                    event.complete(generation);
                    Ok(())
                }
            },
            Some(q) => {
                let mut guard = q.lock().unwrap();
                let q = &mut *guard;
                let worker = match &mut q.worker {
                    Some(w) => w,
                    none => {
                        let started = Self::start_worker(&q.name, self.progress.clone())?;
                        none.insert(started)
                    }
                };
                self.progress.0.lock().unwrap().submitted += 1;
                worker.send(work).map_err(|_| {
                    // Nothing was queued: a synchronize waits for no more than before.
                    self.progress.0.lock().unwrap().submitted -= 1;
                    Error::driver("stream enqueue", "stream worker has stopped")
                })
            }
        }
    }

    fn wait_for(&self, target: u64) -> Result<()> {
        let (lock, cv) = &*self.progress;
        let mut p = lock.lock().unwrap();
        while p.completed < target {
            p = cv.wait(p).unwrap();
        }
        match p.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl StreamImpl for SimStream {
    fn handle(&self) -> u64 {
        self.handle
    }

    fn synchronize(&self) -> Result<()> {
        self.forbid_in_capture(
            "synchronizing",
            "the host would wait for work that is only being recorded",
        )?;
        let target = self.progress.0.lock().unwrap().submitted;
        self.wait_for(target)?;
        match self.on_synchronize.get() {
            Some(hook) => hook(),
            None => Ok(()),
        }
    }

    fn query(&self) -> Result<bool> {
        self.forbid_in_capture("querying", "recorded work has no progress to query")?;
        let p = self.progress.0.lock().unwrap();
        Ok(p.completed >= p.submitted)
    }

    fn record(&self, event: &Event) -> Result<()> {
        self.forbid_in_capture(
            "recording an event",
            "the simulated GPU captures one stream and keeps no event in a graph (CUDA \
             makes it a dependency for other streams joining the capture)",
        )?;
        let ev = sim_event(event)?;
        let generation = ev.arm();
        self.push(Work::Signal(ev.clone(), generation))
    }

    fn wait(&self, event: &Event) -> Result<()> {
        self.forbid_in_capture(
            "waiting on an event",
            "a dependency on work outside the capture (CUDA's \
             cudaErrorStreamCaptureIsolation)",
        )?;
        let ev = sim_event(event)?.clone();
        let target = ev.state.0.lock().unwrap().recorded;
        self.enqueue(Box::new(move || {
            ev.wait_generation(target);
            Ok(())
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn sim_event(event: &Event) -> Result<&Arc<SimEventInner>> {
    event
        .downcast::<SimEvent>()
        .map(|e| &e.0)
        .ok_or_else(|| Error::InvalidArgument("an event of another backend was used".into()))
}

/// The simulated stream behind `stream`, which must be `device`'s.
pub(crate) fn sim_stream(stream: &Stream, device: DeviceId) -> Result<&SimStream> {
    stream.downcast_on::<SimStream>(device)
}

#[derive(Default)]
struct EventState {
    /// Incremented by every record; the event is complete when `completed` catches up.
    recorded: u64,
    completed: u64,
    at: Option<Instant>,
}

pub(crate) struct SimEventInner {
    state: (Mutex<EventState>, Condvar),
}

impl SimEventInner {
    fn arm(&self) -> u64 {
        let mut s = self.state.0.lock().unwrap();
        s.recorded += 1;
        s.recorded
    }

    fn complete(&self, generation: u64) {
        let mut s = self.state.0.lock().unwrap();
        if generation > s.completed {
            s.completed = generation;
            s.at = Some(Instant::now());
        }
        self.state.1.notify_all();
    }

    fn wait_generation(&self, target: u64) {
        let mut s = self.state.0.lock().unwrap();
        while s.completed < target {
            s = self.state.1.wait(s).unwrap();
        }
    }
}

pub(crate) struct SimEvent(pub Arc<SimEventInner>);

impl SimEvent {
    pub fn new_event(device: DeviceId) -> Event {
        Event::new(
            device,
            Arc::new(SimEvent(Arc::new(SimEventInner {
                state: (Mutex::new(EventState::default()), Condvar::new()),
            }))),
        )
    }
}

impl EventImpl for SimEvent {
    fn synchronize(&self) -> Result<()> {
        let target = self.0.state.0.lock().unwrap().recorded;
        self.0.wait_generation(target);
        Ok(())
    }

    fn query(&self) -> Result<bool> {
        let s = self.0.state.0.lock().unwrap();
        Ok(s.completed >= s.recorded)
    }

    fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let end = sim_event(end)?;
        let start = self.0.state.0.lock().unwrap().at;
        let stop = end.state.0.lock().unwrap().at;
        match (start, stop) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(Error::InvalidArgument(
                "elapsed time asked of an event that has not completed".into(),
            )),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
