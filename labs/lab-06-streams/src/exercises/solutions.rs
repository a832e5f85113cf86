//! Reference solutions to the exercises in `starter.rs`.

use std::time::Duration;

use labs_core::{Device, Result, Stream, Tensor};

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
