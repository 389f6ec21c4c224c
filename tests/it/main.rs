//! Integration tests against the real Redis, MariaDB and RabbitMQ. One binary, so it
//! compiles once; every test isolates itself (see `support`).

mod admin;
mod buckets;
mod burst;
mod catalogue;
mod cli;
mod clock;
mod clusters;
mod crashes;
mod docs;
mod draws;
mod ecosystem;
mod edge;
mod faults;
mod fleet;
mod galera;
mod generated;
mod history;
mod layout;
mod lifecycle;
mod operations;
mod payments;
mod plans;
mod protection;
mod purchase;
mod queue;
mod recovery;
mod rehearsal;
mod retention;
mod setup;
mod shapes;
mod shops;
mod storefront;
mod support;
mod upgrade;
mod waiting_room;
