"""Engine: the core loop (scheduler + model runner), input and output processing."""
