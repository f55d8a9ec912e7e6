"""The real engine measured against the simulator: `profile/` (time steps on the local device
for `kvpd calibrate`), `validate/` (`kvpd validate`: real runs against simulated ones), and the
KV-cache ladder benchmark."""
