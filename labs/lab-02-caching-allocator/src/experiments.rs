use anyhow::Result;
use labs_core::Device;

pub fn run(_device: &Device) -> Result<()> {
    Ok(())
}
