//! RabbitMQ (AMQP 0-9-1) source for idem's consumer runner.
#![deny(missing_docs)]
