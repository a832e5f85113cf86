//! Graph capture on the simulated GPU: a capturing stream records the work enqueued on
//! it (`stream.rs`), and the graph replays the recording on the stream it is launched
//! on, as one piece of that stream's work. A dry run records nothing, since it enqueues
//! no work: its graphs have no nodes, and what they change is where memory comes from.

use std::sync::Arc;

use super::stream::{sim_stream, Node};
use super::SimBackend;
use crate::backend::{GraphExec, GraphExecImpl, Graphs, Stream};
use crate::error::Result;

impl Graphs for SimBackend {
    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        sim_stream(stream, self.id)?.begin_capture()
    }

    fn end_capture(&self, stream: &Stream) -> Result<GraphExec> {
        let nodes = sim_stream(stream, self.id)?.end_capture()?;
        Ok(GraphExec::new(
            self.id,
            Arc::new(SimGraph {
                device: self.id,
                nodes: Arc::new(nodes),
            }),
        ))
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        Ok(sim_stream(stream, self.id)?.is_capturing())
    }
}

/// The recorded work of one capture.
struct SimGraph {
    device: crate::backend::DeviceId,
    nodes: Arc<Vec<Node>>,
}

impl GraphExecImpl for SimGraph {
    fn launch(&self, stream: &Stream) -> Result<()> {
        let nodes = self.nodes.clone();
        // One piece of work: a graph runs whole, in order, after the stream's earlier
        // work and before its later work. Launched inside another capture, it is
        // recorded there as one node (a child graph).
        sim_stream(stream, self.device)?
            .submit(Arc::new(move || nodes.iter().try_for_each(|node| node())))
    }

    fn nodes(&self) -> usize {
        self.nodes.len()
    }
}
