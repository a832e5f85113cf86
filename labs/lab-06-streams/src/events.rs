//! Events: a marker recorded in a stream. The host can ask whether the stream has got
//! there (query), wait for it (synchronize), time the work between two of them
//! (elapsed), and another stream can wait for it without the host being involved.

use std::time::Duration;

use labs_core::format::duration;
use labs_core::kernels::Kernel;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Stream, Tensor};

pub struct Lifecycle {
    pub queried_right_after_record: bool,
    pub queried_after_synchronize: bool,
    pub elapsed: Duration,
}

// ANCHOR: event_lifecycle
pub fn lifecycle(device: &Device, target: Duration) -> Result<Lifecycle> {
    let stream = device.new_stream()?;
    let (x, iterations) = crate::busy_work(device, &stream, target)?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    stream.record(&start)?;
    x.spin_on(iterations, &stream)?;
    stream.record(&end)?;
    let queried_right_after_record = end.query()?; // the kernel is still running
    end.synchronize()?; // the host waits here, and only here
    Ok(Lifecycle {
        queried_right_after_record,
        queried_after_synchronize: end.query()?,
        elapsed: crate::event_duration(&start, &end)?,
    })
}
// ANCHOR_END: event_lifecycle

pub fn lifecycle_table(device: &Device, m: &Lifecycle) -> Table {
    let mut t = Table::new(
        format!("An event recorded after a kernel on {device}"),
        &["step", "result"],
    );
    t.row([
        "query() right after record",
        &m.queried_right_after_record.to_string(),
    ]);
    t.row([
        "query() after synchronize()",
        &m.queried_after_synchronize.to_string(),
    ]);
    t.row(["elapsed_ms(start, end)", &duration(m.elapsed)]);
    t
}

// ANCHOR: stream_wait
/// A producer stream writes `data` (after some busy work); a consumer stream doubles
/// it into a new tensor. With `wait`, the consumer waits on an event the producer
/// recorded, on the device, with the host never blocking.
pub fn produce_consume(
    device: &Device,
    producer: &Stream,
    consumer: &Stream,
    busy: (&Tensor, u32),
    wait: bool,
) -> Result<Tensor> {
    let n = 1 << 16;
    let data = Tensor::zeros(&[n], DType::F32, device)?;
    let out = Tensor::zeros(&[n], DType::F32, device)?;
    device.synchronize()?;
    busy.0.spin_on(busy.1, producer)?;
    device.backend().fill(
        data.ptr(),
        labs_core::device::FillPattern::U32(1.0f32.to_bits()),
        n,
        producer,
    )?;
    if wait {
        let written = device.new_event()?;
        producer.record(&written)?;
        consumer.wait(&written)?;
    }
    device
        .backend()
        .launch(&Kernel::scale(data.ptr(), 2.0, out.ptr(), n), consumer)?;
    consumer.synchronize()?;
    producer.synchronize()?;
    Ok(out)
}
// ANCHOR_END: stream_wait

/// How many of the consumer's results are right, without and with the wait.
pub fn ordering(device: &Device, busy: Duration) -> Result<(usize, usize, usize)> {
    let (producer, consumer) = (device.new_stream()?, device.new_stream()?);
    let (x, iterations) = crate::busy_work(device, &producer, busy)?;
    // The consumer's kernel once beforehand: its first launch loads its module, which
    // can take long enough for the producer to finish, hiding the race.
    let warm = Tensor::zeros(&[1], DType::F32, device)?;
    device
        .backend()
        .launch(&Kernel::scale(warm.ptr(), 2.0, warm.ptr(), 1), &consumer)?;
    consumer.synchronize()?;
    let right = |t: Tensor| -> Result<usize> {
        Ok(t.to_vec::<f32>()?.iter().filter(|&&v| v == 2.0).count())
    };
    let without = right(produce_consume(
        device,
        &producer,
        &consumer,
        (&x, iterations),
        false,
    )?)?;
    let with = right(produce_consume(
        device,
        &producer,
        &consumer,
        (&x, iterations),
        true,
    )?)?;
    Ok((1 << 16, without, with))
}

pub fn ordering_table(device: &Device, (n, without, with): (usize, usize, usize)) -> Table {
    let mut t = Table::new(
        format!("A consumer stream reading what a producer stream writes, on {device}"),
        &["consumer", "correct results"],
    );
    t.row([
        "runs at once (no wait)".to_string(),
        format!("{without} of {n}"),
    ]);
    t.row([
        "waits on the producer's event".to_string(),
        format!("{with} of {n}"),
    ]);
    t
}
