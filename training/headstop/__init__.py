"""The Ray head's own stop (its pod's preStop hook): its jobs stopped as `ray job stop`
stops them, so a driver ends its run (a final checkpoint, its last upload) before the
kubelet's SIGTERM takes Ray down."""
