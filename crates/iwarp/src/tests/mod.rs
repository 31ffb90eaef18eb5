mod wire;
