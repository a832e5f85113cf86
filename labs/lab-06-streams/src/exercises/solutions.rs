//! Reference solutions to the exercises in `starter.rs`.

use std::time::Duration;

use labs_core::device_id::DevicePtr;
use labs_core::{Device, Result, Stream, Tensor};

use super::{Pending, StreamPool};

pub fn make_wait(device: &Device, producer: &Stream, consumer: &Stream) -> Result<()> {
    let event = device.new_event()?;
    producer.record(&event)?;
    consumer.wait(&event)
}

pub fn time_with_events(
    device: &Device,
    stream: &Stream,
    work: &mut dyn FnMut() -> Result<()>,
) -> Result<Duration> {
    let (start, end) = (device.new_event()?, device.new_event()?);
    stream.record(&start)?;
    work()?;
    stream.record(&end)?;
    end.synchronize()?;
    Ok(Duration::from_secs_f64(
        start.elapsed_ms(&end)? as f64 / 1e3,
    ))
}

pub fn spin_both(device: &Device, a: &Tensor, b: &Tensor, iterations: u32) -> Result<()> {
    let (s1, s2) = (device.new_stream()?, device.new_stream()?);
    a.spin_on(iterations, &s1)?;
    b.spin_on(iterations, &s2)?;
    s1.synchronize()?;
    s2.synchronize()
}

impl StreamPool {
    pub fn record_stream(&mut self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        let i = self.live_index(ptr)?;
        let live = &mut self.live[i];
        // The block's own stream orders its later work after the free by itself.
        let known = (live.owner.handle() == stream.handle())
            || live.used_by.iter().any(|s| s.handle() == stream.handle());
        if !known {
            live.used_by.push(stream.clone());
        }
        Ok(())
    }

    pub fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        let i = self.live_index(ptr)?;
        let live = self.live.swap_remove(i);
        if live.used_by.is_empty() {
            self.free.push((live.ptr, live.owner));
            return Ok(());
        }
        // One event per other stream, recorded now: it completes once the work that
        // stream had queued at the free is done.
        let mut events = Vec::with_capacity(live.used_by.len());
        for stream in &live.used_by {
            let event = self.device.new_event()?;
            stream.record(&event)?;
            events.push(event);
        }
        self.pending.push(Pending {
            ptr: live.ptr,
            owner: live.owner,
            events,
        });
        Ok(())
    }

    pub(super) fn process_events(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let mut done = true;
            for event in &self.pending[i].events {
                // `query`, never `synchronize`: the host does not wait.
                done &= event.query()?;
            }
            if done {
                let p = self.pending.swap_remove(i);
                self.free.push((p.ptr, p.owner));
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}
