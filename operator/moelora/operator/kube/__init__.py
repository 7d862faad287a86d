"""Talking to the Kubernetes API: reads, status patches and create-or-patch of owned objects (`apply`, the only
module that writes), Events with their correlator (`events`), and the shared model cache's claims and Jobs
(`cache_sync`)."""
