mod conn;
mod stream;
mod wire;
